"""Process supervision: a private Ray's processes and their reaping, the autoscaler request's
guard, the object stores' monitor. Execution lives in ``arrayjob.runtime``; this watches the
processes it runs on."""
