"""Live observers of a running job, reading what its ranks write: the progress line (:mod:`.progress`) and
TensorBoard scalars (:mod:`.tensorboard`). The launchers start them; they never steer the job."""
