"""The rules' entry points, one module per rule file: each holds the job functions its rules' scripts call, and
nothing else. A job reads its inputs, calls the library (the other subpackages) and writes its outputs; no library
module imports a job."""
