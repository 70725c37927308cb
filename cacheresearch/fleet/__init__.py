"""Fleet shapes over the fcfs replica: autoscaling with cold caches (:mod:`.autoscale`)."""
