"""The engine: the processes of a run (`roles/`), what they share (`plumbing/`), how a run survives faults
(`recovery/`), what it keeps on disk (`store/`), data-parallel learners under torchrun (`distributed/`) and this
process's devices, threads and seeds (`host/`). A role never imports another role."""
