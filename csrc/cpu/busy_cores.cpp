// busy_cores.cpp — threads_left_by_others (see busy_cores.h).
#include "cpu/busy_cores.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace brrr {
namespace cpu {
namespace {

constexpr double kWindowSeconds = 0.3;  // /proc/stat counts 10 ms ticks: ~60 per window on 2
                                        // cores keep a quiet machine well under half a core
constexpr double kFirstWindowSeconds = 0.08;  // after an idle gap: ~16 ticks on 2 cores, an error
                                              // of 2-3 ticks still rounds to the right core count

double seconds(clockid_t clock) {
    timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Busy + stolen CPU seconds since boot of the CPUs this process may run on (its affinity mask,
// which a container's cpuset narrows: the machine's other CPUs are not ours to count); < 0 when
// /proc/stat is unreadable.
double allowed_cpus_busy_seconds() {
    static cpu_set_t allowed;
    static const bool have_mask = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long total = 0;
    bool any = false;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
        if (std::strncmp(line, "cpu", 3) != 0 || !std::isdigit((unsigned char)line[3]))
            continue;  // the "cpu " total line, or not a cpu line at all
        int cpu = -1;
        unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0,
                           softirq = 0, steal = 0;
        if (std::sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &user, &nice,
                        &system, &idle, &iowait, &irq, &softirq, &steal) < 8)
            continue;
        if (cpu < 0 || (have_mask && (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)))) continue;
        total += user + nice + system + irq + softirq + steal;
        any = true;
    }
    std::fclose(f);
    if (!any) return -1;
    static const double tick = 1.0 / (double)sysconf(_SC_CLK_TCK);
    return (double)total * tick;
}

struct Watch {
    std::mutex mutex;
    double wall = -1, machine = 0, own = 0;  // at the start of the current window
    double window = kWindowSeconds;          // length of the current window
    double others = 0;                       // cores other processes used in the last window
};

}  // namespace

int threads_left_by_others(int all_cores) {
    static Watch watch;
    std::lock_guard<std::mutex> lock(watch.mutex);
    const double wall = seconds(CLOCK_MONOTONIC);
    if (watch.wall < 0 || wall - watch.wall >= watch.window) {
        const double machine = allowed_cpus_busy_seconds();
        const double own = seconds(CLOCK_PROCESS_CPUTIME_ID);
        if (machine < 0) return all_cores;
        // After an idle gap the sample mostly says what ran while this engine did not: start a
        // fresh, short window with all cores rather than act on it, so a busy core is seen again
        // within kFirstWindowSeconds of the engine's own work.
        const bool idle_gap = watch.wall >= 0 && wall - watch.wall > 2 * kWindowSeconds;
        if (idle_gap)
            watch.others = 0;
        else if (watch.wall >= 0)
            watch.others = std::max(0.0, (machine - watch.machine) - (own - watch.own)) /
                           (wall - watch.wall);
        watch.window = watch.wall < 0 || idle_gap ? kFirstWindowSeconds : kWindowSeconds;
        watch.wall = wall;
        watch.machine = machine;
        watch.own = own;
    }
    const int taken = (int)std::lround(watch.others);
    return std::max(1, all_cores - taken);
}

}  // namespace cpu
}  // namespace brrr
