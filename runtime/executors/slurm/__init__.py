"""The Slurm executor's room: one ``sbatch`` per allocation (:mod:`.executor`), the batch
script and its submission (:mod:`.batch`, :mod:`.submit`), the per-node agent
(:mod:`.task`), Slurm's commands and node limits (:mod:`.commands`, :mod:`.nodes`),
``apportion export slurm`` (:mod:`.export`), ``apportion cluster import --from slurm``
(:mod:`.importer`), and a private Slurm cluster on this machine for tests
(:mod:`.local_cluster`)."""
