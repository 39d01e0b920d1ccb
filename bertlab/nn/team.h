/* How many of PyTorch's OpenMP threads a call of bertlab's kernels takes (team.c): all of them,
   or fewer while some have lately been found off their cores. A kernel's parallel region:

       const int team = bertlab_team(threads, rows of the call);
       int64_t waited[team];  (zeros)
       const int64_t start = bertlab_now();
       #pragma omp parallel num_threads(team)
       {
         #pragma omp for nowait
         ...
         BERTLAB_WAIT(waited);  (each barrier: how long each thread waited at it)
       }
       bertlab_team_waited(waited, team, bertlab_now() - start); */

#ifndef BERTLAB_TEAM_H
#define BERTLAB_TEAM_H

#include <omp.h>
#include <stdint.h>
#include <time.h>

int bertlab_team(int threads, int64_t rows);
void bertlab_team_waited(const int64_t *waited, int team, int64_t took);
int bertlab_team_adapt(int on);

static inline int64_t bertlab_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* An OpenMP barrier, timed on each thread */
#define BERTLAB_WAIT(waited)                                   \
  do {                                                         \
    const int64_t before_ = bertlab_now();                     \
    _Pragma("omp barrier");                                    \
    (waited)[omp_get_thread_num()] += bertlab_now() - before_; \
  } while (0)

#endif
