"""The local executor's room: worker process groups on this machine (:mod:`.executor`) and
the GPUs this machine offers them (:mod:`.gpus`)."""
