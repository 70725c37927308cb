"""The Hydra shell around the core: the sweep (`sweep`), chunked resumable runs (`chunks`), reports (`report`)."""
