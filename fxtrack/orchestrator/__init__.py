"""The orchestrator: the Hydra app that turns a config into jobs, runs each in a worker process
and hands the Results to tracking. It imports no framework."""
