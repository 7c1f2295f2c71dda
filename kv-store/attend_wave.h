/* Wave mode's attend (RetroInfer's wave index, split between the worker and the stores): the
 * worker clusters each kv head's keys, installs the clusters here (clusters.h) and picks, each
 * step, the clusters of its retrieval zone; the store returns for each asked q head the exact
 * partial (attend.h) over the rows of its kv head's selected clusters plus every row of the kv
 * head here that no cluster covers (the shards' lag: appended, not clustered yet), so a stored
 * row is either in a cluster the worker can select or always attended.
 *
 * Every key and value row is loaded once for all asked q heads of its GQA group: strips of 64
 * rows, gathered across clusters, are scored against the group's queries while in L1, weighted
 * by an online softmax (ra_vec_exp_sum) and accumulated. Work is split into (kv head, row
 * chunk) tasks run by OpenMP, whose partials merge exactly per q head in task order (the same
 * result for the same request and thread count). n_scanned counts the rows attended; ids (when
 * asked) are their row positions, selected clusters in row order, then the lag.
 *
 * Retro (attend.h): each past step's queries get the exact partial over the clusters the request
 * names for that step, without the lag (the worker keeps what each past step has seen, so the
 * store keeps no records in this mode). They are scored in the same pass: a row is loaded once,
 * for the request's queries and those of every past step naming its cluster, so the supplement
 * costs arithmetic on cached rows, not W more scans (bench/results/h200/retro-wave/). retro_us
 * is the threads' time in the past steps' arithmetic over the pass's thread count. */
#ifndef KVS_ATTEND_WAVE_H
#define KVS_ATTEND_WAVE_H

#include "attend.h"

/* Whether kvs_attend hands the request here: mode wave, or a cluster selection given (which
 * other modes refuse). */
int kvs_attend_is_wave(const kvs_attend_args *a);

/* The attend of a request whose q heads check_args (attend.c) accepted; caller holds the
 * session's read lock. RA_EINVAL for a malformed selection (counts not summing to the ids, a kv
 * head named twice or of no asked q head, a cluster id not held here or named twice, a
 * selection outside mode wave, retro lists not shaped [n_retro, n_heads] or not summing to their
 * ids). On failure `out` holds nothing. */
int kvs_attend_wave(const kvs_session *s, const kvs_attend_args *a, int n_threads,
                    kvs_attend_result *out, ra_error *err);

#endif
