// The emulators' threadgroup scheduler (lanes.h): every thread of a threadgroup is a coroutine with its
// own stack (started with ucontext, switched with _setjmp/_longjmp: no system call per switch);
// a thread runs until it reaches a barrier or a SIMD-group function, then the next one runs.
// When every live thread of a simdgroup waits at a SIMD-group function (or every thread of the
// threadgroup at threadgroup_barrier) they are released together, so the collectives see every
// lane's value exactly as on the GPU. Threadgroups run one after another.
//
// It also catches what the GPU compilers do not: a threadgroup barrier that some thread of the
// threadgroup never reaches (it returned early), threads of one simdgroup at different SIMD
// barriers, and a deadlock.
#undef _FORTIFY_SOURCE  // its longjmp check refuses jumps between stacks, which is the point here
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lanes.h"

namespace er_emulator {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr uint32_t kMaxThreads = 1024;
constexpr uint32_t kSimd = 32;

enum class State { Running, AtThreadgroupBarrier, AtSimdBarrier, Done };

struct Lane {
    ucontext_t context;  // the first entry
    jmp_buf jump;        // where it waits
    bool started = false;
    State state = State::Done;
    uint64_t barriers = 0;       // threadgroup barriers passed
    uint64_t simd_barriers = 0;  // SIMD-group barriers passed (each collective is two)
    uint64_t value = 0;          // this lane's operand of the current collective
    bool in_collective = false;
};

struct Grid {
    Invoke fn = nullptr;
    const void* args = nullptr;
    const void* extra = nullptr;
    uint32_t group[3] = {0, 0, 0}, groups[3] = {0, 0, 0};
    uint32_t threads = 0;
    uint32_t current = 0;
    SwitchHook hook = nullptr;
    jmp_buf scheduler;
    std::unique_ptr<Lane[]> lanes{new Lane[kMaxThreads]};
    std::unique_ptr<char[]> stacks{new char[kMaxThreads * kStackBytes]};
};

Grid& grid() {
    static Grid g;
    return g;
}

void lane_main() {
    Grid& g = grid();
    g.fn(g.args, g.extra, g.group[0], g.group[1], g.group[2], g.current);
    g.lanes[g.current].state = State::Done;
    _longjmp(g.scheduler, 1);
}

void wait(State s) {
    Grid& g = grid();
    Lane& me = g.lanes[g.current];
    me.state = s;
    if (_setjmp(me.jump) == 0) _longjmp(g.scheduler, 1);
}

std::string where(const Grid& g) {
    return "threadgroup (" + std::to_string(g.group[0]) + ", " + std::to_string(g.group[1]) + ", " + std::to_string(g.group[2]) + ")";
}

// Releases the lanes of any simdgroup whose live lanes all wait at a SIMD barrier, or the
// whole threadgroup when every lane waits at threadgroup_barrier. Returns whether it did.
bool release(Grid& g) {
    bool released = false;
    for (uint32_t s0 = 0; s0 < g.threads; s0 += kSimd) {
        bool any = false, all = true;
        uint64_t count = 0;
        for (uint32_t t = s0; t < s0 + kSimd; ++t) {
            const Lane& l = g.lanes[t];
            if (l.state == State::Done) continue;
            if (l.state != State::AtSimdBarrier) {
                all = false;
                break;
            }
            if (any && l.simd_barriers != count)
                throw std::runtime_error("emulator: lanes of simdgroup " + std::to_string(s0 / kSimd) + " in " + where(g) +
                                         " wait at different SIMD-group functions (divergent control flow)");
            count = l.simd_barriers;
            any = true;
        }
        if (!any || !all) continue;
        for (uint32_t t = s0; t < s0 + kSimd; ++t)
            if (g.lanes[t].state == State::AtSimdBarrier) {
                g.lanes[t].state = State::Running;
                ++g.lanes[t].simd_barriers;
            }
        released = true;
    }
    if (released) return true;
    bool all = true, any_done = false;
    uint32_t done_lane = 0;
    for (uint32_t t = 0; t < g.threads; ++t) {
        const State s = g.lanes[t].state;
        if (s == State::Done) {
            any_done = true;
            done_lane = t;
        } else if (s != State::AtThreadgroupBarrier) {
            all = false;
        }
    }
    if (!all) return false;
    if (any_done)
        throw std::runtime_error("emulator: threadgroup_barrier in " + where(g) + " is not reached by every thread (thread " +
                                 std::to_string(done_lane) + " returned)");
    for (uint32_t t = 0; t < g.threads; ++t) {
        g.lanes[t].state = State::Running;
        ++g.lanes[t].barriers;
    }
    return true;
}

}  // namespace

void threadgroup_barrier() { wait(State::AtThreadgroupBarrier); }
void simdgroup_barrier() { wait(State::AtSimdBarrier); }

uint64_t simd_exchange(uint64_t bits, int op, uint32_t arg) {
    Grid& g = grid();
    const uint32_t me = g.current, s0 = me / kSimd * kSimd;
    g.lanes[me].value = bits;
    g.lanes[me].in_collective = true;
    wait(State::AtSimdBarrier);  // every live lane has put its value
    uint64_t result = bits;
    auto f32 = [](uint64_t b) {
        float f;
        const uint32_t u = static_cast<uint32_t>(b);
        std::memcpy(&f, &u, 4);
        return f;
    };
    auto bits32 = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return static_cast<uint64_t>(u);
    };
    if (op == kXor || op == kBroadcast || op == kDown) {
        const uint32_t lane = op == kXor ? (me - s0) ^ arg : op == kBroadcast ? arg : me - s0 + arg;
        const uint32_t src = s0 + lane;
        if (lane < kSimd && src < g.threads && g.lanes[src].in_collective) result = g.lanes[src].value;
    } else if (op == kBallot || op == kMatchAny) {
        result = 0;
        for (uint32_t t = s0; t < s0 + kSimd && t < g.threads; ++t) {
            const Lane& l = g.lanes[t];
            if (l.in_collective && (op == kBallot ? l.value != 0 : l.value == bits)) result |= uint64_t{1} << (t - s0);
        }
    } else {
        bool first = true;
        float fr = 0;
        uint32_t ur = 0;
        int32_t ir = 0;
        for (uint32_t t = s0; t < s0 + kSimd && t < g.threads; ++t) {
            const Lane& l = g.lanes[t];
            if (!l.in_collective || (op == kSumIn && !(arg >> (t - s0) & 1))) continue;
            const float fv = f32(l.value);
            const uint32_t uv = static_cast<uint32_t>(l.value);
            const int32_t iv = static_cast<int32_t>(uv);
            switch (op) {
                case kSum: fr = first ? fv : fr + fv; break;
                case kMax: fr = first ? fv : std::fmax(fr, fv); break;
                case kMin: fr = first ? fv : std::fmin(fr, fv); break;
                case kSumU:
                case kSumIn: ur = first ? uv : ur + uv; break;
                case kMaxU: ur = first ? uv : (uv > ur ? uv : ur); break;
                case kMinU: ur = first ? uv : (uv < ur ? uv : ur); break;
                case kSumI: ir = first ? iv : ir + iv; break;
                default: throw std::logic_error("emulator: unknown SIMD-group operation");
            }
            first = false;
        }
        if (op == kSum || op == kMax || op == kMin) result = bits32(fr);
        else if (op == kSumI) result = static_cast<uint32_t>(ir);
        else result = ur;
    }
    wait(State::AtSimdBarrier);  // every lane has read the values
    g.lanes[me].in_collective = false;
    return result;
}

void set_switch_hook(SwitchHook hook) { grid().hook = hook; }

void run_grid(Invoke fn, const void* args, const void* extra, const uint32_t groups[3], uint32_t threads) {
    if (threads == 0 || threads > kMaxThreads || threads % kSimd != 0)
        throw std::invalid_argument("emulator: " + std::to_string(threads) + " threads per threadgroup (a multiple of 32, at most 1024)");
    Grid& g = grid();
    g.fn = fn;
    g.args = args;
    g.extra = extra;
    g.threads = threads;
    for (int i = 0; i < 3; ++i) g.groups[i] = groups[i];
    for (uint32_t z = 0; z < groups[2]; ++z)
        for (uint32_t y = 0; y < groups[1]; ++y)
            for (uint32_t x = 0; x < groups[0]; ++x) {
                g.group[0] = x;
                g.group[1] = y;
                g.group[2] = z;
                for (uint32_t t = 0; t < threads; ++t) {
                    Lane& l = g.lanes[t];
                    l = Lane{};
                    getcontext(&l.context);
                    l.context.uc_stack.ss_sp = g.stacks.get() + t * kStackBytes;
                    l.context.uc_stack.ss_size = kStackBytes;
                    l.context.uc_link = nullptr;  // lane_main never returns
                    makecontext(&l.context, lane_main, 0);
                    l.state = State::Running;
                }
                for (;;) {
                    volatile bool ran = false;
                    bool live = false;
                    for (volatile uint32_t t = 0; t < threads; t = t + 1) {
                        Lane& l = g.lanes[t];
                        if (l.state != State::Running) continue;
                        ran = true;
                        g.current = t;
                        if (g.hook) g.hook(t, g.group, g.groups, g.threads);
                        if (_setjmp(g.scheduler) == 0) {
                            if (l.started) _longjmp(l.jump, 1);
                            l.started = true;
                            setcontext(&l.context);
                        }
                    }
                    for (uint32_t t = 0; t < threads; ++t) live |= g.lanes[t].state != State::Done;
                    if (!live) break;
                    if (!release(g) && !ran)
                        throw std::runtime_error("emulator: deadlock in " + where(g) +
                                                 ": threads wait at threadgroup and SIMD-group barriers at once");
                }
            }
}

}  // namespace er_emulator
