"""kvmesh.replica.step: the step contract below the engine and the worker: what the scheduler hands the runner
(``SchedulerOutput``) and what comes back (``ModelRunnerOutput``), and the outputs built from it."""
