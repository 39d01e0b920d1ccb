/* The team of a call of bertlab's kernels (team.h): PyTorch's OpenMP threads, or the calling
   thread alone while the others are off their cores.

   An OpenMP loop ends at a barrier: every thread of the team must arrive, including one that
   the operating system has taken off its core to run another process. On cores shared with busy
   processes (a server's own tokenizer and HTTP threads, a neighbour's job) that happens often,
   and each call then waits for it, up to a time slice of the scheduler (milliseconds). Beside
   two busy processes on 2 cores, bertlab's int8 model at batch 1 kept 21% of its quiet
   throughput on two threads and 50% on one (docs/performance.md, "Threads off their cores").

   So each call notes how long each thread of its team waited at its barriers. On a quiet
   machine the threads arrive together (the loops share the work evenly: they wait microseconds,
   a few percent of a long call); where one waited LATE or more, and at least a SHARE of the
   call's time, a teammate was off its core. After two such calls in a row (one alone is
   as likely a host's interruption of a virtual machine) the next HOLD calls take only as many
   threads as waited (on 2 cores, the calling thread alone); each late call that follows doubles
   HOLD (up to HOLD_MOST), and a call whose team all arrived in time sets it back. So under
   contention bertlab runs on the threads that get their cores, trying the whole team again now
   and then, and on a quiet machine, where no thread waits long, every call takes the whole
   team.

   Only calls of one sentence's rows are held back (at most SHORT rows: batch 1). Beside busy
   processes, batches of 32 sorted by length did as well on the whole team as held back, or
   better, in the runs measured (docs/performance.md): their calls keep the whole team, as
   before this file.

   One thread computes each output, in one order, whatever the team: the results are the same
   bits. The counters are shared by every thread that calls the kernels, read and written
   without ordering: a call that reads a stale value only runs with one more or one fewer
   thread. */

#include "team.h"

#include <stdatomic.h>

#define LATE 300000    /* ns: a thread that waited this long at a barrier waited for one... */
#define SHARE 4        /* ... where that is also at least 1/SHARE of the call */
#define HOLD_FIRST 16  /* calls on fewer threads after the second late call in a row */
#define HOLD_MOST 4096 /* at most (about 170 sentences of the bundled model at batch 1) */
#define SHORT 64       /* rows (tokens): a call of at most this many may be held back */

static _Atomic int adaptive = 1; /* 0: every call takes the whole team (bertlab_team_adapt) */
static _Atomic int hold;     /* calls left to run on fewer threads */
static _Atomic int held;     /* the length of the last hold; 0: the team was last in time */
static _Atomic int in_time;  /* the threads of the last late call that waited for the others */
static _Atomic int was_late; /* 1: the call before this one was late */

int bertlab_team(int threads, int64_t rows) {
  if (threads <= 1) return 1;
  if (rows > SHORT) return threads;
  if (!atomic_load_explicit(&adaptive, memory_order_relaxed)) return threads;
  const int left = atomic_load_explicit(&hold, memory_order_relaxed);
  if (left <= 0) return threads;
  atomic_store_explicit(&hold, left - 1, memory_order_relaxed);
  const int fewer = atomic_load_explicit(&in_time, memory_order_relaxed);
  return fewer < 1 ? 1 : fewer < threads ? fewer : threads;
}

void bertlab_team_waited(const int64_t *waited, int team, int64_t took) {
  if (team <= 1) return;
  const int64_t late = took / SHARE > LATE ? took / SHARE : LATE;
  int punctual = 0; /* the threads that waited for a late one */
  for (int i = 0; i < team; i++) punctual += waited[i] >= late;
  if (!punctual) {
    atomic_store_explicit(&held, 0, memory_order_relaxed);
    atomic_store_explicit(&was_late, 0, memory_order_relaxed);
    return;
  }
  if (!atomic_exchange_explicit(&was_late, 1, memory_order_relaxed)) return; /* (the first) */
  const int before = atomic_load_explicit(&held, memory_order_relaxed);
  const int next = before <= 0 ? HOLD_FIRST : before >= HOLD_MOST / 2 ? HOLD_MOST : 2 * before;
  atomic_store_explicit(&in_time, punctual, memory_order_relaxed);
  atomic_store_explicit(&held, next, memory_order_relaxed);
  atomic_store_explicit(&hold, next, memory_order_relaxed);
}

/* 1: as above (the default); 0: every call takes all its threads, as an OpenMP loop does (for
   measuring what the above gains: benchmarks/harness/team_contention.py). Returns the setting
   before, and clears any hold. */
int bertlab_team_adapt(int on) {
  atomic_store_explicit(&hold, 0, memory_order_relaxed);
  atomic_store_explicit(&was_late, 0, memory_order_relaxed);
  atomic_store_explicit(&held, 0, memory_order_relaxed);
  return atomic_exchange(&adaptive, on != 0);
}
