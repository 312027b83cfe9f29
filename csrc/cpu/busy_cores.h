// busy_cores.h — how many OpenMP threads a call of the CPU engine should use on a shared machine.
//
// Every decode step is hundreds of statically split parallel regions, each finished only when its
// slowest thread is. When another process holds a core, the engine's thread on that core gets a
// fraction of it, every region waits for that thread, and decode with all cores runs below the
// speed of one thread alone. So an engine built with "all cores" (n_threads 0) uses only the cores
// other processes leave free: cores allowed minus the cores others used, rounded, at least 1.
// "Others" is the busy time from /proc/stat of the CPUs this process may run on (plus time the
// hypervisor stole) less this process's own CPU time, averaged over a window of kWindowSeconds;
// it is re-read at most once per window, so a call costs one clock read. Results do not depend on the thread count, so this only
// changes speed. An explicit thread count is used as given.
#pragma once

namespace brrr {
namespace cpu {

// OpenMP threads for the next call of an engine that asked for `all_cores` threads (its
// omp_get_num_procs()): all_cores minus the cores other processes used lately, at least 1.
// Without /proc/stat: all_cores.
int threads_left_by_others(int all_cores);

}  // namespace cpu
}  // namespace brrr
