// Preloaded (LD_PRELOAD) into the tests of a LOOM_SANITIZE=address build,
// never linked into loom: dlclose does nothing, so shared objects stay mapped
// until the process exits.
//
// Why: Open MPI loads its components (mca_*.so) with dlopen in MPI_Init and
// unloads them in MPI_Finalize, before LeakSanitizer reports at exit. The
// memory those components keep for the life of the process then shows with
// "<unknown module>" frames, which lsan.supp cannot name, and every MPI test
// would fail on Open MPI's leaks. Kept mapped, the frames name their
// libraries and lsan.supp suppresses exactly those.
extern "C" int dlclose(void*) { return 0; }
