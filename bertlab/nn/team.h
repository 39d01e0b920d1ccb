/* How many of PyTorch's OpenMP threads a call of bertlab's kernels takes (team.c): all of them,
   or fewer while some have lately been found off their cores. A kernel's parallel region:

       struct bertlab_team team;
       bertlab_team_begin(&team, threads, rows of the call);
       #pragma omp parallel num_threads(team.size)
       {
         #pragma omp for nowait
         ...
         BERTLAB_WAIT(team);  (each barrier: how long each thread waited at it)
       }
       bertlab_team_end(&team); */

#ifndef BERTLAB_TEAM_H
#define BERTLAB_TEAM_H

#include <omp.h>
#include <stdint.h>
#include <time.h>

#define BERTLAB_TEAM_MOST 1024 /* threads a call takes at most */

struct bertlab_team {
  int size;                                 /* the threads of this call */
  int64_t start;                            /* when it began (ns) */
  int64_t waited[BERTLAB_TEAM_MOST];        /* each thread's time at the barriers (ns) */
};

int bertlab_team(int threads, int64_t rows);
void bertlab_team_waited(const int64_t *waited, int team, int64_t took);
int bertlab_team_adapt(int on);

static inline int64_t bertlab_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void bertlab_team_begin(struct bertlab_team *t, int threads, int64_t rows) {
  t->size = bertlab_team(threads < BERTLAB_TEAM_MOST ? threads : BERTLAB_TEAM_MOST, rows);
  for (int i = 0; i < t->size; i++) t->waited[i] = 0;
  t->start = bertlab_now();
}

static inline void bertlab_team_end(const struct bertlab_team *t) {
  bertlab_team_waited(t->waited, t->size, bertlab_now() - t->start);
}

/* An OpenMP barrier, timed on each thread */
#define BERTLAB_WAIT(team)                                          \
  do {                                                              \
    const int64_t before_ = bertlab_now();                          \
    _Pragma("omp barrier");                                         \
    (team).waited[omp_get_thread_num()] += bertlab_now() - before_; \
  } while (0)

#endif
