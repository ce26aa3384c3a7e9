#!/usr/bin/env bash
# The GPU runs the open issues still wait on, each part under its own time limit, results under $R.
#
#     R=benchmarks/results bash benchmarks/gpu_pending.sh tuner_linear scaleout attention e2e
#
# On the device machine, R=$OUT/r (with summary_<card>.json copied there first): a call stopped at its time limit
# still brings back what its finished parts wrote, where an archive made at the end of the command would be lost.
# A call brings back at most 8 files, so where the parts write more (keys: a dozen), PACK=$OUT/r.tgz with R outside
# $OUT: after every part, $R as one archive (made aside, then moved into place), so a call cut short still brings
# back every finished part's files (session 34: an e2e run's JSON was the ninth file, left behind), and the archive
# is made again every PACK_EVERY (45) seconds while a part runs, so a part cut short keeps what it wrote so far.
#
# Files a part writes carry the card's name (<card>: h200, h100; $CARD below) where they say one.
# Parts (run in the order given; one that fails or runs out of time does not stop the next):
#   suite         #23 the GPU suite (benchmarks/gpu_suite.sh), log $R/pytest_gpu_<card>_run<N>.log (N=${RUN:-2}); 362 s on
#                     an H100 in session 34, before the library roots' timed evaluations joined its timing part (3 more
#                     evaluations, ~50 s each): under a 600 s call, PARTS=1 in one call and PARTS=2 in the next
#   eval_rate     #18 seconds per evaluation in a running search, linear / attention / rmsnorm, phase by phase
#                     ($R/eval_rate_<card>${NAME_SUFFIX}.{json,md}; EVALS=3 evaluations an op; it writes the eval_s_*
#                     keys of $R/summary_<card>.json)
#   eval_rate_prestart3
#                 #18 eval_rate with 3 pre-started candidate children (--prestart 3): since session 34 a GPU is timed
#                     with the spares still starting paused (`spares.Spares.quiet`) instead of waiting for them (3.3-6.6 s
#                     of 14-18 s an evaluation on an H100), so a spare's start spreads over the evaluations' untimed
#                     parts; with one spare the next evaluation may wait for it instead ($R/eval_rate_<card>_prestart3.*)
#   eval_rate_nosettle
#                 #18 eval_rate with TIK_SPARE_SETTLE=0: the candidate timed while spares start beside it, neither paused
#                     nor waited for ($R/eval_rate_<card>_nosettle.{json,md}): it counts only with the root against
#                     itself within +-1% and every cheat caught the same way: TIK_SPARE_SETTLE=0 CHEATS_SUFFIX=_nosettle
#                     ... cheats
#   eval_rate_rmsnorm, eval_rate_attention, eval_rate_linear
#                 #18 the same, one operator per part (EVALS=3 evaluations; an attention or linear part fills a call)
#   eval_repeat_rmsnorm, eval_repeat_attention, eval_repeat_linear
#                 #18 each of EVALS=2 candidates evaluated twice in a row (--repeat): the second finds its kernels
#                     compiled, so the phases' differences are what compiling a candidate costs
#   rvi           #18 the root timed against itself (rmsnorm, 7 cells): within ±1% per cell?
#   reply_copy    #18 a device tensor copied into a reply file's pages: faulted by the copy, populated first, registered
#                     with the driver, both; a pinned buffer as the bound ($R/reply_copy_<card>.json)
#   probe_times   #18 where a probes child's compute goes, probe by probe, linear's root (eval_phases.py --probe-times;
#                     $R/probe_times_<card>_linear.json)
#   cheats        #18 every planted timing cheat and the root against itself, 100 rounds
#                     ($R/evaluator_cheats_<card>${CHEATS_SUFFIX:-}.{json,md}): after a change to the timing harness
#   search_linear, search_attention
#                 #18 the tuner on the current root, in a workspace kept under .gpu_ws/ (ignored: carry it),
#                     530 s per call (RUN=1, 2: the summary's suffix) and going on from the IR the next call: two
#                     calls back to back (the machine stays warm 30 s) make the 20-minute search. Each call starts
#                     from $R/$SEARCH_NAME_workspace.tgz (default tuner_<card>_<op>_20min) when .gpu_ws/<op> is absent
#                     and saves it again (copy it back with the results). Needs GitPython, gitdb and
#                     smmap, which the GPU image lacks: carry them as wheels (.whl, see the device notes)
#   search_pair   #18 search_linear and search_attention at once on one GPU (two processes, their timings taking turns
#                     through the device lock, the rest overlapping): three calls (480 s of search each, then the
#                     workspace archived) make both 20-minute searches in the device time of one
#                     ($R/tuner_<card>_pair_20min_{linear,attention}_run<RUN>.*, one workspace archive); WALL (480)
#                     seconds of search a call: with 400 the three calls (about 1,260 s) fit a session's 1,800 s
#   scaleout_shared
#                 #18 evaluations an hour with one and two evaluator processes on one GPU (`tik search --workers 2`:
#                     timings taking turns through the device lock, CPU work overlapping): rmsnorm, EVALS (12)
#                     derivations each ($R/scaleout_<card>_shared${NAME_SUFFIX}.{json,md}); GPUS (1,2): the counts,
#                     SCALEOUT_ENV (e.g. TIK_PRESTART=0: no pre-started children, whose starts hold the device's lock
#                     shared) set for the run. H100, session 43: one process 6 in 239 s (9.7 s an evaluation), then two
#                     processes had not finished 6 when the call ended 320 s later (session 40: the same with 12); the
#                     rows now carry the phases two processes wait in (device_wait, spare_settle), the first
#                     evaluation's start and the rate once started: GPUS=2 EVALS=4, then with SCALEOUT_ENV=TIK_PRESTART=0
#                     NAME_SUFFIX=_noprestart
#   tuner_linear  #6  tik search --proposer tuner on linear, best vs root in the same evaluation;
#                     exports the incumbent to $R/incumbents_<card>/linear.py
#   scaleout      #9  evaluations per hour on the visible GPUs (1, and more where lent)
#   attention     #16 bitwise sweep + prefill, forward+backward, decode (B 1..128 x L 1k..32k) vs SDPA, decode
#                     split variants timed (targets: decode <= 1.05x, prefill <= 0.85x, fwd+bwd <= 1.15x)
#   e2e           #8  layer profile stock / unified root / incumbents ($R/incumbents_<card>), throughput
#                 #19 at full depth (qwen3-0.6b and qwen3-1.7b, 28 layers), decode steps replayed as CUDA graphs;
#                     e2e_B_over_C / e2e_B_over_A in $R/summary_<card>.json
#   e2e_decode    #19 one decode step (qwen3-0.6b, 64 sequences) vs the weight + KV bandwidth floor, stock and
#                     unified, graphs and eager; e2e_decode_floor_ratio in $R/summary_<card>.json
#   e2e_learning  #19 GRPO from scratch, modes A and B, 3 seeds: $R/e2e_learning_seeds.{csv,png}
#   e2e_full      #19 throughput at full depth, one preset per run (qwen3-0.6b, then qwen3-1.7b, ~100 s each), the
#                     library roots (no incumbents), results in $R/e2e_full_<preset>/
#   e2e_minibatch #19 throughput at full depth, qwen3-0.6b then qwen3-1.7b (~60 s each on an H100), a batch of 256
#                     sequences (32 prompts x 8) trained in one pass of 4 minibatch updates (the clip binds from the
#                     second), modes C and B (B/C; and A at qwen3-1.7b, B/A), 2 steps after a thrown-away run of the
#                     same steps, results in $R/e2e_minibatch_<preset>/; on an H200 the 1.7b run writes e2e_B_over_C,
#                     e2e_B_over_A. MINIBATCHES=N: N updates a pass instead of 4 (8 for mode A at 1.7b on an H100: its
#                     peak was 60.2 GB at 8 with the tied presets of session 31; 4 ran out of memory untied, untried tied)
#   rollout_profile
#                 #19 one rollout of the e2e throughput batch (qwen3-1.7b, 64 requests), prefill / decode / host, unified
#                     and stock ($R/rollout_profile_<card>_qwen3-1.7b.{json,log})
#   prefill_chunks
#                 #19 the e2e batch's rollout (qwen3-0.6b, 32 prompts x 8, 256 slots) with prefills of at most 8192
#                     prompt tokens (4 prefills) and 32768 (one, the engine's default since session 31), back to back: its prefills took
#                     0.19 s of a 0.52 s rollout in session 30, longer than the recompute pass over 1.5x their tokens
#                     ($R/rollout_profile_<card>_qwen3-0.6b_prefill{8192,32768}.json)
#   decode_breakdown
#                 #19 one qwen3-0.6b decode step call by call, stock and unified ($R/decode_breakdown_<card>_*.md)
#   decode_cuts   #19 the session-19 decode cuts (rope_cache, qk_norm, NARROW_PCT, the fused decode merge; their GPU
#                     tests are the suite's): one qwen3-0.6b decode step call by call with NARROW_PCT 25 (the CONFIG's), 0 and 50
#                     ($R/decode_breakdown_<card>_qwen3-0.6b_s19{,_narrow0,_narrow50}.md), then the whole step vs
#                     its floor, stock, unified and unified-s18 (the step before the cuts) in one run
#   pdl           #19 the decode step's launch variants (programmatic dependent launch, on by default; the linear's
#                     weight prefetch; the one-pass lm_head) against the step before sessions 19 and 20, in one run
#                     ($R/e2e_decode_pdl/), then the step call by call without PDL, and stock beside unified
#   stock_decode  #19 mode A's decode step, compiled with automatic dynamic shapes (now) and with every dimension
#                     symbolic (stock-dynamic), beside unified ($R/e2e_decode_stock/), its lm_head alone
#                     ($R/lmhead_decode_<card>.json), and the step call by call (why did its lm_head take 4.9 ms there?)
#   qk_rope       #19 the one-launch q / k norms + rope + cache fill (UnifiedBackend(fused_qk_rope=True)) and the lm_head
#                     kernels' CHUNKS: their GPU bit tests, then the decode step with and without the one launch
#                     ($R/e2e_decode_qk_rope/); turn fused_qk_rope on by default if both hold
#   overlap       #19 the rollout loop with the host ahead of the device (RolloutEngine(overlap=True)): the GPU test of
#                     its bits (graphs vs eager), then one qwen3-1.7b rollout timed with and without it
#                     ($R/rollout_profile_<card>_qwen3-1.7b_overlap.{json,log})
#   narrow        #19 #16 linear's narrow-output chunks (NARROW_N / NARROW_KCHUNK, off in the root: a new tree for weights
#                     of at most NARROW_N rows): the decode step with chunks of 512 and 1024 beside the root's, in one run
#                     ($R/e2e_decode_narrow/), then call by call ($R/decode_breakdown_<card>_qwen3-0.6b_s22{,_narrow512}.md)
#   linear_k4096  #16 the linear tree with chunks of 4096 (a new tree: KCHUNK 4096, other bits) against today's 2048, each
#                     with every bucket's candidate launches against cuBLAS (benchmarks/sweep_linear.py --kchunk, one run
#                     each, $R/linear_sweep_<card>_k{4096,2048}_s44/): at K = 4096 (Qwen3-8B's qkv, o, gate_up) one
#                     chunk, so the walking launch carries no running total (ONE_CHUNK: the 128 x 256 tile without its
#                     460 / 356 B of spills, results/linear_offline_s44.txt) where large M trails cuBLAS by 5-10%, and
#                     the small-M launches lose the split over K's two chunks (their narrower tiles are candidates)
#   linear_one_chunk
#                 #16 linear's ONE_CHUNK launch choice (no running total where K is one chunk) on and off under the 4096
#                     tree, beside the 2048 tree, one sweep each ($R/linear_sweep_<card>_k4096_one{0,1}_s44/,
#                     $R/linear_sweep_<card>_k2048_s44b/): session 44's linear_k4096 call had the 128 x 256 launch at
#                     1.31-1.38x cuBLAS with it against 1.07-1.10x under the 2048 tree (its running total), the other
#                     buckets faster under 4096. H100, session 44: ONE_CHUNK off under 4096 geomean 1.045, worst 1.236,
#                     M <= 16 0.986; on 1.088 / 1.381 / 0.978; the 2048 tree 1.060 / 1.210 / 1.005 (the sweeps then
#                     dropped their 128 x 256 candidates, a warm-up bug since fixed). Session 45: ptxas serializes the
#                     one-chunk 128 x 256 launch's wgmmas (C7515, results/linear_offline_s45.txt); a reset of the
#                     accumulator in the loop compiled clean but made every wgmma launch 1.1-1.8x slower on an H100
#                     (reverted). Now: the one-chunk bit test, qwen3-0.6b's projections with ONE_CHUNK off and on, then
#                     the three sweeps above ($R/linear_sweep_<card>_{qwen3-0.6b_one{0,1},k4096_one{0,1},k2048}${SUFFIX}/,
#                     SUFFIX=_s45 unless set)
#   linear_swap   #16 linear's SWAP launch choice (session 45: the decode-size tile computed transposed, w @ x.T, so its 16
#                     token rows are wgmma's columns, not the register-fed mma's rows): its bit test, then the M16 and
#                     M64 buckets' candidate launches against cuBLAS with SWAP off and on, one sweep each, Qwen3-8B's
#                     projections and qwen3-0.6b's ($R/pytest_gpu_<card>_linear_swap.log,
#                     $R/linear_sweep_<card>_<model>_swap{0,1}_s45/). H100, session 45: bits green, no faster
#   linear_walk   #16 linear's M16_WALK_PCT and M64_WALK_PCT launch choices (session 47: a launch that would split K
#                     walks it where tiles of 32 or more columns fill WALK_PCT % of the SMs; off): its bit test, then
#                     the M16 and M64 buckets' launches against cuBLAS over Qwen3-8B's projections with both at 0
#                     (today's), 70 and 100, one sweep each, the three in one call ($R/pytest_gpu_<card>_linear_walk.log,
#                     $R/linear_sweep_<card>_walk{0,70,100}_s47/), then qwen3-0.6b's M16, M64 and M1024 cells at the
#                     root's CONFIG (M16_NARROW and FULL_WAVE_PCT, session 47: $R/linear_sweep_<card>_qwen3-0.6b_s47/),
#                     cell by cell: $R/sweep_cells_<card>_walk_s47.md; the sweep's "linear" column is the entry
#                     point's launch, the rules'
#   train_profile #19 where the trainer's time goes (benchmarks/train_profile.py): the 4 minibatch updates of a 256-sequence
#                     qwen3-0.6b rollout, alone and right after a recompute pass, part by part and kernel by kernel,
#                     unified then stock ($R/train_profile_<card>_qwen3-0.6b{,_stock}.{json,md})
#   lmhead_merge  #19 the lm_head combines' pipelined chunk loop (MERGE_STAGES, session 25) against the loop before, in one
#                     run, and the one-pass main kernel's launch choices with it (4 warps: two blocks an SM; CHUNKS)
#                     (bench_lmhead_decode.py --only ...; $R/lmhead_decode_<card>.json)
#   lmhead_step   #19 the decode step with the one-pass lm_head (the default since session 25) beside the two passes and
#                     stock, in one run ($R/e2e_decode_lmhead/)
#   lmhead_flat   #19 sample_logprob's pass with a chunk's tiles and K steps in one loop and 4 stages (logprob's FLAT and
#                     SLP_STAGES, on since session 28): its GPU bit test, the lm_head alone (nested, FLAT, 2 to 4 stages)
#                     and the decode step beside the nested pass of 3 stages
#   lmhead_regs   #19 sample_logprob's pass with its registers capped (logprob's SLP_MAXNREG 128, on since session 29, or
#                     168: two programs an SM instead of one; 80 with 3 stages: three, every chunk of a decode batch at
#                     once): its GPU bit tests, the lm_head alone and the decode step with and without (uncapped: the
#                     variant "uncapped"; m80s3)
#   lmhead_bwd    #19 #16 the trainer's lm_head backward with its dz scratch in bf16 (logprob's BWD_DZ_LOW), grad_hidden in
#                     64-row tiles (BWD_GH_BLOCK_M), the grad kernels in 5 stages (BWD_STAGES), all off, and K steps of 64
#                     (BWD_BLOCK_K: the bench's bit gate says whether it keeps the bits): the GPU bit test, then logprob
#                     forward + backward vs eager log_softmax + gather with and without them (bench_speed.py --only ops,
#                     its logprob_bwd cells; sm_90 offline: results/lmhead_bwd_ptx_offline_s29.txt)
#   lmhead_bwd2   #19 #16 the lm_head backward's launch choices that move no bits (logprob's BWD_GW_HFAST: grad_w's grid
#                     with the H tiles of a V tile side by side; BWD_CHUNK_T 2048 / 4096: fewer, larger dz scratches)
#                     beside the default (the bf16 scratch since session 30) and the fp32 scratch: the GPU bit test,
#                     bench_speed's ops (its logprob_bwd cells at hidden 4096 and 1024), then the trainer's updates part
#                     by part ($R/train_profile_<card>_qwen3-0.6b.md)
#   train_variants
#                 #19 the attention backward's dS region starts computed once per cu (session 30, not yet on a GPU):
#                     its GPU bit tests; then the trainer's updates (qwen3-0.6b, 4 minibatches) with the norms'
#                     weight gradients in blocks of 32 / 64 rows a program (add_rmsnorm's and rmsnorm's BWD_ROWS, 128:
#                     a minibatch's ~10.6k rows are 83 programs on 132 SMs, add_rmsnorm's backward at about a
#                     quarter of the copy bandwidth; new dw bits, still deterministic) beside the CONFIG's, interleaved
#                     in one run
#                     ($R/train_profile_<card>_qwen3-0.6b_variants.md), and with the logged entropy from logprob's pass
#                     (logprob's FWD_ENTROPY, on since session 32: one lm_head pass an update instead of two)
#   varlen        #16 #19 mode A's packed attention through torch's flash varlen kernel (StockBackend's default where the
#                     probe passes, session 32): its GPU test; then bench_speed's varlen section (forward + backward
#                     over an RL minibatch's packed sequences vs that kernel and the padded SDPA path; $R/speed_<card>_varlen.md)
#   mlp_fused     #19 the rollout's MLP gate_up projection and silu_mul in one launch (linear's linear_silu_mul; session
#                     32's launch over row pairs was no faster on an H100, its epilogue split the pairs apart; since
#                     session 37 two accumulators, gate rows and up rows, and the weight as it is): its GPU bit test at
#                     the qwen3 MLPs, then the decode step with it and with the two launches ($R/e2e_decode_mlp_fused/)
#   linear_small  #16 linear vs cuBLAS (bench_speed's linear section, 9 rounds) with the M16 bucket's launch moved, no bits:
#                     the weight's lines sent to L2 before the PDL wait (PREFETCH 1: the next call's stream starts while
#                     the call before ends), 8 programs an SM instead of 4 (M16_SPLIT 8), both
#                     ($R/speed_<card>_linear_variants.{json,md}; M <= 16 is at 0.99-1.00x of cuBLAS, the target 0.95x)
#   decode_regs   #19 the decode attention's short-cache launch with its registers capped (attention's decode_short_maxnreg
#                     128 / 168, 8 warps at 64; off: 4 warps take 242 registers, two programs an SM, so a qwen3-0.6b
#                     batch of 64's 512 programs run in two rounds): its GPU bit test, then the decode step with each
#                     ($R/e2e_decode_dregs/; sm_90 offline: results/attn_decode_regs_offline_s29.txt), and with linear's
#                     NARROW_PCT 50 / 100 beside (at 25, the CONFIG's, qkv at a batch of 64 is 64 programs on 132 SMs,
#                     gate_up 96: narrower tiles give 128 / 256 and 192)
#   decode_combine
#                 #19 the decode step with linear's split sums combined by the tile's last program at a batch of 64
#                     (FUSED_MAX_M 64; the CONFIG's 16 keeps a second kernel there, chosen on Qwen3-8B's widths): a
#                     qwen3-0.6b layer's o and down projections split K (2 and 3 chunks) and each takes two launches, 56
#                     of the step's ~280 kernels; and with NARROW_PCT 50, and with every batch-of-64 tile 32 wide
#                     (fused64n32: the down projection's 3 chunks x 32 tiles = 96 programs, each reading the batch's
#                     [64, 1024] x chunk from L2 once, where NARROW_PCT 25 halves its tiles to 16 wide: 192 programs
#                     and twice the x re-reads, 25 MB of L2 traffic for 6 MB of weights). Who computes a chunk and who
#                     adds the chunk sums, never their order: no bits ($R/e2e_decode_combine/)
#   qk_regs       #19 the one-launch q / k norms + rope + cache fill with the halves from registers (rmsnorm's ROPE_REGS,
#                     off: no gain on an H100 in session 26): its GPU bit tests, then the decode step with and without,
#                     one run ($R/e2e_decode_qk_regs/)
#   lmhead        #19 the lm_head's launch variants alone (bench_lmhead_decode.py: sample's V_WAVES among them), at a
#                     decode batch of 64 ($R/lmhead_decode_<card>.json)
#   stock_paths   #19 mode A's decode step (its cache fill inside the compiled rope since session 23, the fastest) beside
#                     each other stock-path option alone (the fill as two scatters, as row copies, folded-GQA attention)
#                     and unified, one run ($R/e2e_decode_stock_paths/)
#   late          #18 the probes' late inputs (TIK_LATE_INPUTS=1, tik_kernels/contract/late.py): the planted early
#                     reader must fail and every evaluator GPU test pass with them on ($R/pytest_gpu_late*.log)
#   attn_bwd      #16 the attention backward variants (the stored-dS root's knobs and budget, the dq kernel's path
#                     and its knobs, fused dq) vs SDPA flash
#   attn_tests    #16 attention's GPU bit tests (test_attention*.py -m gpu): run them after an attention kernel changed
#   rope_bits     #19 the multiply-adds written out (session 26): rope's rotation and its copy in the one-launch q / k
#                     norms + rope + cache fill, logprob's chunk merge; the GPU bit tests of rope, rmsnorm, the rope cache
#                     and the lm_head (red before the change: pytest_gpu_h100_s26_qk_regs_red.log)
#   prefill       #16 prefill (the forward's launch choices beside the CONFIG's: longest walks first, 128-row tiles of 8
#                     warps and 2 stages, pointer loads, two loops, 8 warps, the running total in memory) and forward + backward vs SDPA flash ($R/speed_<card>_prefill*)
#   fwd_timeline  #16 the prefill forward program by program, read inside the kernel (%clock64, %globaltimer): a
#                     program's fixed cost and a block's, gaps between programs on an SM, the tail, at S = 1k .. 16k
#                     ($R/attn_fwd_timeline.{md,json}): where the short-sequence gap to SDPA flash goes; again with
#                     FWD_ONE_LOOP=0 (the diagonal blocks in their own loop, the CONFIG before session 28: _two_loops)
#   speed         #16 bench_speed: linear / decode / prefill / fwd+bwd / ops vs stock, bits-gated;
#                     $R/speed_<card>.{md,json} and its keys of $R/summary_<card>.json
#   hf            #20 apply_tik on a random-init Qwen3-0.6B (transformers): bitwise log-probs, time vs stock,
#                     then the GPU test of tests/hf
#   shared_prompts
#                 #19 a GRPO group's prompt prefilled once (RolloutEngine(share_prompts=True), session 33, not yet on a
#                     GPU): its GPU bit test, the qwen3-0.6b rollout of 256 requests with and without it
#                     ($R/rollout_profile_<card>_qwen3-0.6b_shared{,_off}.json), then the RL step without it (the
#                     keys part's qwen3-0.6b run is the one with it; $R/e2e_minibatch_qwen3-0.6b_noshare/)
#   gluon_fwd     #16 the prefill forward in Gluon with its next block's K and V loaded behind this block's work
#                     (tik_kernels/ops/attention_gluon.py, the root's forward on Hopper since session 41; its forms
#                     through experimental/gluon_attn_fwd.py): its bit test against the Triton forward, then its time
#                     beside the Triton forward's and SDPA flash's at bench_speed's prefill cells
#                     ($R/pytest_gpu_<card>_gluon_fwd.log, $R/gluon_fwd_<card>.{json,md}; H100, session 41: 21 passed,
#                     geomean 0.705 of flash against the Triton forward's 0.919)
#   gluon_root    #16 the root's forward as the Gluon kernel (FWD_GLUON): its bit tests, the attention GPU suite, then
#                     bench_speed --only prefill fwdbwd varlen with the Triton forward as a variant (--variant triton=...)
#   gluon_fwd_ws  #16 the warp-specialized Gluon prefill forward (a producer warp, two consumer warpgroups; session 40;
#                     red on an H100 in session 41): its bit test, then bench_gluon_fwd.py --ws (every form again beside
#                     it, $R/gluon_fwd_ws_<card>.*); apart from gluon_fwd and last, since a barrier no one arrives at hangs
#   gluon_linear  #16 the M <= 16 linear in Gluon, computed transposed from a ring of TMA-fed weight tiles
#                     (tik_kernels/experimental/gluon_linear_small.py, session 40): its bit test against the root, then
#                     its time beside the root's and cuBLAS's at bench_speed's M <= 16 cells
#                     ($R/pytest_gpu_<card>_gluon_linear.log, $R/gluon_linear_<card>.*; H100, session 41: the root's
#                     bits, geomean 1.034 of cuBLAS against the root's 1.004)
#   keys          #16 #19 every figure of summary_<card>.json that bench_speed and bench_e2e write, in one call (on an
#                     H100, session 33: speed 63 s, decode 88 s, the qwen3-1.7b step of 4 timed steps with mode A 192 s,
#                     qwen3-0.6b 53 s): speed, e2e_decode, then STEPS=4 e2e_minibatch at qwen3-1.7b and qwen3-0.6b
# Each call brings back its own copy of $R/summary_<card>.json: benchmarks/summary_merge.py merges the copies into the
# repository's, key by key by provenance date, and renames the files they cite to where the results were saved.
# Needs no package beyond torch and triton (the store uses only the standard library and GitPython:
# carry GitPython, gitdb and smmap as wheels where they are missing).
set -u
R=${R:-benchmarks/results}
# the card, for the names of the files a part writes whose name says it (h200, h100)
CARD=$(PYTHONPATH=${PYTHONPATH:-}:. "${PYTHON:-python3}" -c "from benchmarks.harness import card_tag; print(card_tag('cuda'))" 2>/dev/null || echo cpu)
mkdir -p "$R" "$R/unused"  # unused/: the summaries of runs whose figures are variants, kept apart
export PYTHONPATH=${PYTHONPATH:-}:. PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
xdist=$("$py" -c "import xdist" 2>/dev/null && echo "-n 4")  # pytest-xdist's workers where it is installed

part() {  # part NAME SECONDS CMD...: run CMD under a limit, log to $R/NAME.log, report its status
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$R/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0))s" | tee -a "$R/$name.log"
    tail -4 "$R/$name.log"
    pack
}

pack() {  # $R as one archive at $PACK, made aside then moved into place (an archive is always whole)
    if [[ -n ${PACK:-} ]]; then
        tar czf "$PACK.$BASHPID" -C "$R" . 2>/dev/null && mv -f "$PACK.$BASHPID" "$PACK"
    fi
}

if [[ -n ${PACK:-} ]]; then
    # also every ${PACK_EVERY:-45} s while a part runs, for as long as this script lives: a call stopped at its time
    # limit in the middle of a part then still brings back what that part had written (its log so far, the rows a
    # benchmark writes as it goes); session 40 lost a 10-minute scale-out run that had no finished part to pack
    (while sleep "${PACK_EVERY:-45}" && kill -0 $$ 2>/dev/null; do pack; done) >/dev/null 2>&1 &
fi

for p in "$@"; do
    case $p in
        suite)
            part "pytest_gpu_${CARD}_run${RUN:-2}" 590 bash benchmarks/gpu_suite.sh "$R/pytest_gpu_${CARD}_run${RUN:-2}_suite.log" ;;
        eval_rate)
            part eval_rate 590 "$py" benchmarks/bench_eval_rate.py --evals "${EVALS:-3}" --out "$R" --name "eval_rate_${CARD}${NAME_SUFFIX:-}" ;;
        eval_rate_prestart3)
            part eval_rate_prestart3 590 "$py" benchmarks/bench_eval_rate.py --evals 3 --prestart 3 --out "$R" \
                --name "eval_rate_${CARD}_prestart3" ;;
        eval_rate_nosettle)
            part eval_rate_nosettle 590 env TIK_SPARE_SETTLE=0 "$py" benchmarks/bench_eval_rate.py --evals 3 --out "$R" \
                --name "eval_rate_${CARD}_nosettle" ;;
        eval_rate_rmsnorm | eval_rate_attention | eval_rate_linear)
            op=${p#eval_rate_}
            part "$p" 590 "$py" benchmarks/bench_eval_rate.py --evals "${EVALS:-3}" --ops "$op" --out "$R" \
                --name "eval_rate_${CARD}_$op" ;;
        eval_repeat_rmsnorm | eval_repeat_attention | eval_repeat_linear)
            op=${p#eval_repeat_}
            part "$p" 590 "$py" benchmarks/bench_eval_rate.py --evals "${EVALS:-2}" --repeat --ops "$op" --out "$R" \
                --name "eval_repeat_${CARD}_$op" ;;
        rvi)
            part rvi 300 "$py" benchmarks/bench_evaluator_cheats.py --scenarios root_vs_itself \
                --out "$R/evaluator_rvi_${CARD}" ;;
        reply_copy)
            part reply_copy 90 "$py" benchmarks/bench_reply_copy.py --out "$R/reply_copy_${CARD}.json" ;;
        probe_times)
            part probe_times 300 "$py" benchmarks/eval_phases.py --probe-times --op linear \
                --out "$R/probe_times_${CARD}_linear.json" ;;
        cheats)
            part cheats 400 "$py" benchmarks/bench_evaluator_cheats.py --out "$R/evaluator_cheats_${CARD}${CHEATS_SUFFIX:-}" ;;
        search_linear | search_attention)
            op=${p#search_}
            name=${SEARCH_NAME:-tuner_${CARD}_${op}_20min}
            # a search goes on from its saved workspace (a call is limited to 10 minutes; 20 are asked for):
            # --max-time counts the search's wall time over all its runs, --wall stops this run in time to summarise
            ws_saved="$R/${name}_workspace.tgz"
            if [[ ! -d .gpu_ws/$op && -f $ws_saved ]]; then tar xzf "$ws_saved"; fi
            part "$name" 580 "$py" benchmarks/tuner_search.py --ops "$op" --budget 200 \
                --max-time 1200 --wall 530 --timeout 240 --screen 12 --workspace .gpu_ws --out "$R/${name}_run${RUN:-1}"
            tar czf "$ws_saved" .gpu_ws ;;
        search_pair)
            # linear's and attention's searches at once on one GPU, each its own `tik search` process and workspace
            # (.gpu_ws/<op>): their timings take turns at the device (tik_kernels/evaluator/devlock.py), the rest of
            # their evaluations (probes, checks, compiles, proposals) overlap; two calls make their 20 minutes
            name=${SEARCH_NAME:-tuner_${CARD}_pair_20min}
            ws_saved="$R/${name}_workspace.tgz"
            if [[ ! -d .gpu_ws/linear && ! -d .gpu_ws/attention && -f $ws_saved ]]; then tar xzf "$ws_saved"; fi
            for op in linear attention; do
                part "${name}_$op" 580 "$py" benchmarks/tuner_search.py --ops "$op" --budget 200 --max-time 1200 \
                    --wall "${WALL:-480}" --timeout 240 --screen 12 --workspace .gpu_ws --out "$R/${name}_${op}_run${RUN:-1}" &
            done
            wait
            # without the compile caches: on an H100 in session 41 the archive made after two 530 s searches was not
            # done when the 590 s call ended, so the second call had no IR to go on from (hence --wall 480 too)
            tar czf "$ws_saved" --exclude='*cache*' .gpu_ws ;;
        tuner_linear)
            part tuner_linear 570 "$py" benchmarks/tuner_search.py --ops linear --budget 10 --max-time 360 \
                --timeout 150 --screen 16 --out "$R/tuner_${CARD}_linear" --export "$R/incumbents_${CARD}" ;;
        scaleout)
            part scaleout 250 "$py" benchmarks/bench_scaleout.py --op rmsnorm --evals 3 --timeout 120 \
                --out "$R/scaleout_${CARD}.json" ;;
        scaleout_shared)
            # SCALEOUT_ENV unquoted: its NAME=VALUE words are env's arguments
            part "scaleout_shared${NAME_SUFFIX:-}" 590 env ${SCALEOUT_ENV:-} "$py" benchmarks/bench_scaleout.py --op rmsnorm \
                --evals "${EVALS:-12}" --gpus "${GPUS:-1,2}" --timeout 120 --out "$R/scaleout_${CARD}_shared${NAME_SUFFIX:-}.json" ;;
        attention)
            part attention 590 "$py" benchmarks/bench_attention.py --out "$R" --budget 540 ;;
        e2e)
            part e2e 590 "$py" benchmarks/bench_e2e.py --out "$R" --only layers throughput --steps 3 \
                --impl-dir "$R/incumbents_${CARD}" ;;
        e2e_decode)
            part e2e_decode 300 "$py" benchmarks/bench_e2e.py --out "$R" --only decode ;;
        e2e_learning)
            part e2e_learning 590 "$py" benchmarks/bench_e2e.py --out "$R" --only learning --learn-steps 100 ;;
        e2e_full)
            for preset in qwen3-0.6b qwen3-1.7b; do
                part "e2e_full_$preset" 280 "$py" benchmarks/bench_e2e.py --out "$R/e2e_full_$preset" \
                    --only throughput --shapes "$preset" --steps 3
            done ;;
        e2e_minibatch)
            # mode A beside B and C at qwen3-1.7b: the run that writes e2e_B_over_C on an H200 writes e2e_B_over_A too.
            # Untied, that run needed more than an H100's 80 GB (session 28); with the tied presets mode A peaks at
            # 74.9 GB of an H100 at 4 minibatches (session 32), and MINIBATCHES=8 halves a minibatch's activations
            # (each mode's peak is in its results, peak_gpu_bytes). STEPS=4: less run-to-run spread (H100,
            # qwen3-0.6b: B/C 1.132 over 2 steps, 1.143 over 4 on another start, session 32), about 30 s more a preset
            for preset in ${PRESETS:-qwen3-0.6b qwen3-1.7b}; do
                modes="C B"
                [[ $preset == qwen3-1.7b ]] && modes="C B A"
                part "e2e_minibatch_$preset" 280 "$py" benchmarks/bench_e2e.py --out "$R/e2e_minibatch_$preset" \
                    --only throughput --shapes "$preset" --steps "${STEPS:-2}" --prompts 32 --group 8 --max-slots 256 \
                    --ppo-epochs 1 --minibatches "${MINIBATCHES:-4}" --modes $modes
            done ;;
        rollout_profile)
            part rollout_profile_${CARD}_qwen3-1.7b 300 "$py" benchmarks/rollout_profile.py --preset qwen3-1.7b \
                --backends unified stock --out "$R" --name rollout_profile_${CARD}_qwen3-1.7b ;;
        prefill_chunks)
            for n in 8192 32768; do
                part "rollout_profile_${CARD}_qwen3-0.6b_prefill$n" 150 "$py" benchmarks/rollout_profile.py \
                    --preset qwen3-0.6b --prompts 32 --group 8 --slots 256 --backends unified --rounds 3 \
                    --prefill-tokens "$n" --out "$R" --name "rollout_profile_${CARD}_qwen3-0.6b_prefill$n"
            done ;;
        decode_breakdown)
            part decode_breakdown 200 "$py" benchmarks/decode_breakdown.py --out "$R" ;;
        decode_cuts)
            part decode_breakdown_s19 200 "$py" benchmarks/decode_breakdown.py --out "$R" --backends unified --name _s19
            part decode_breakdown_s19_narrow0 200 "$py" benchmarks/decode_breakdown.py --out "$R" --backends unified \
                --set linear.NARROW_PCT=0 --name _s19_narrow0
            part decode_breakdown_s19_narrow50 200 "$py" benchmarks/decode_breakdown.py --out "$R" --backends unified \
                --set linear.NARROW_PCT=50 --name _s19_narrow50
            part e2e_decode_s19 400 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_s19" --only decode \
                --decode-backends stock unified unified-s18 ;;
        pdl)
            part e2e_decode_pdl 420 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_pdl" --only decode \
                --decode-backends stock stock-s19 unified unified-s18 unified-nopdl unified-pdl-prefetch unified-fused-lmhead
            part decode_breakdown_nopdl 200 "$py" benchmarks/decode_breakdown.py --out "$R" --backends unified \
                --set rmsnorm.PDL=0 --set add_rmsnorm.PDL=0 --set rope.PDL=0 --set linear.PDL=0 --set silu_mul.PDL=0 \
                --set attention.DECODE_PDL=0 --set logprob.PDL=0 --name _nopdl
            part decode_breakdown_stock 200 "$py" benchmarks/decode_breakdown.py --out "$R" --backends stock unified \
                --name _stock_unified ;;
        stock_decode)
            part e2e_decode_stock 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_stock" --only decode \
                --decode-backends stock stock-dynamic unified
            part lmhead_decode 150 "$py" benchmarks/bench_lmhead_decode.py --out "$R"
            part decode_breakdown_stock 240 "$py" benchmarks/decode_breakdown.py --out "$R" --backends stock \
                --name _stock_auto --kernels 6 ;;
        varlen)
            part pytest_gpu_${CARD}_stock_varlen 120 "$py" -m pytest -q -m gpu tests/e2e/test_stock_varlen.py
            part "speed_${CARD}_varlen" 300 "$py" benchmarks/bench_speed.py --only varlen --rounds 9 --budget-s 240 \
                --out "$R" ;;
        linear_small)
            part linear_small 300 "$py" benchmarks/bench_speed.py --only linear --out "$R" --rounds 9 --budget-s 240 \
                --summary "$R/unused/summary_$CARD.json" --variant pf=linear.PREFETCH=1 \
                --variant s8=linear.M16_SPLIT=8 --variant pf_s8=linear.PREFETCH=1,linear.M16_SPLIT=8 ;;
        mlp_fused)
            part pytest_gpu_${CARD}_mlp_fused 200 "$py" -m pytest -q -m gpu tests/kernels/test_linear.py -k silu
            part e2e_decode_mlp_fused 200 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_mlp_fused" --only decode \
                --decode-backends unified unified-fused-mlp --decode-context 128 256 ;;
        qk_rope)
            part pytest_gpu_qk_rope 300 "$py" -m pytest -q -m gpu tests/e2e/test_rope_cache.py \
                tests/kernels/test_sample_logprob.py tests/kernels/test_sample.py tests/kernels/test_logprob.py
            part e2e_decode_qk_rope 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_qk_rope" --only decode \
                --decode-backends unified unified-qk-rope ;;
        overlap)
            part pytest_gpu_rollout 240 "$py" -m pytest -q -m gpu tests/e2e/test_decode_graphs_gpu.py
            part "rollout_profile_${CARD}_qwen3-1.7b_overlap" 300 "$py" benchmarks/rollout_profile.py \
                --preset qwen3-1.7b --backends unified --rounds 3 --out "$R" --name "rollout_profile_${CARD}_qwen3-1.7b_overlap" ;;
        narrow)
            part e2e_decode_narrow 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_narrow" --only decode \
                --decode-backends unified unified-narrow512 unified-narrow1024
            part decode_breakdown_narrow 240 "$py" benchmarks/decode_breakdown.py --out "$R" --backends unified --name _s22
            part decode_breakdown_narrow512 240 "$py" benchmarks/decode_breakdown.py --out "$R" --backends unified \
                --set linear.NARROW_N=2048 --set linear.NARROW_KCHUNK=512 --name _s22_narrow512 ;;
        linear_k4096)
            for kc in 4096 2048; do
                part "linear_sweep_${CARD}_k${kc}" 285 "$py" benchmarks/sweep_linear.py --tma 1 --kchunk "$kc" \
                    --budget-s 170 --out "$R/linear_sweep_${CARD}_k${kc}_s44"
            done ;;
        linear_one_chunk)
            sfx=${SUFFIX:-_s45}
            part "pytest_gpu_${CARD}_linear_one_chunk" 200 "$py" -m pytest -q -m gpu tests/kernels/test_linear.py -k one_chunk
            for one in 0 1; do
                part "linear_sweep_${CARD}_qwen3-0.6b_one${one}" 150 "$py" benchmarks/sweep_linear.py --tma 1 \
                    --model qwen3-0.6b --set "ONE_CHUNK=$one" --budget-s 90 --out "$R/linear_sweep_${CARD}_qwen3-0.6b_one${one}$sfx"
            done
            for one in 0 1; do
                part "linear_sweep_${CARD}_k4096_one${one}" 200 "$py" benchmarks/sweep_linear.py --tma 1 --kchunk 4096 \
                    --set "ONE_CHUNK=$one" --budget-s 120 --out "$R/linear_sweep_${CARD}_k4096_one${one}$sfx"
            done
            part "linear_sweep_${CARD}_k2048" 200 "$py" benchmarks/sweep_linear.py --tma 1 --kchunk 2048 --budget-s 120 \
                --out "$R/linear_sweep_${CARD}_k2048$sfx" ;;
        linear_swap)
            part "pytest_gpu_${CARD}_linear_swap" 200 "$py" -m pytest -q -m gpu tests/kernels/test_linear.py -k swap
            for model in qwen3-8b qwen3-0.6b; do
                for sw in 0 1; do
                    part "linear_sweep_${CARD}_${model}_swap${sw}" 150 "$py" benchmarks/sweep_linear.py --tma 1 \
                        --model "$model" --buckets M16 M64 --set "M16_SWAP=$sw" --set "M64_SWAP=$sw" --budget-s 90 \
                        --out "$R/linear_sweep_${CARD}_${model}_swap${sw}_s45"
                done
            done ;;
        linear_walk)
            part "pytest_gpu_${CARD}_linear_walk" 150 "$py" -m pytest -q -m gpu tests/kernels/test_linear.py -k walk
            for pct in 0 70 100; do
                part "linear_sweep_${CARD}_walk${pct}" 140 "$py" benchmarks/sweep_linear.py --tma 1 --model qwen3-8b \
                    --buckets M16 M64 --set "M16_WALK_PCT=$pct" --set "M64_WALK_PCT=$pct" --budget-s 80 \
                    --out "$R/linear_sweep_${CARD}_walk${pct}_s47"
            done
            # session 47's other two rules at the root's CONFIG: qwen3-0.6b's M16 launches unnarrowed (M16_NARROW 0), its
            # qkv at M = 1024 on the 128 x 256 tile (FULL_WAVE_PCT)
            part "linear_sweep_${CARD}_qwen3-0.6b" 140 "$py" benchmarks/sweep_linear.py --tma 1 --model qwen3-0.6b \
                --buckets M16 M64 M1024 --budget-s 80 --out "$R/linear_sweep_${CARD}_qwen3-0.6b_s47"
            part "sweep_cells_${CARD}_walk" 30 "$py" benchmarks/sweep_cells.py "$R/linear_sweep_${CARD}"_walk{0,70,100}_s47 \
                "$R/linear_sweep_${CARD}_qwen3-0.6b_s47" --out "$R/sweep_cells_${CARD}_walk_s47.md" ;;
        train_profile)
            part "train_profile_${CARD}_qwen3-0.6b" 240 "$py" benchmarks/train_profile.py --preset qwen3-0.6b --out "$R" \
                --name "train_profile_${CARD}_qwen3-0.6b"
            part "train_profile_${CARD}_qwen3-0.6b_stock" 240 "$py" benchmarks/train_profile.py --preset qwen3-0.6b \
                --backend stock --out "$R" --name "train_profile_${CARD}_qwen3-0.6b_stock" ;;
        lmhead_merge)
            part lmhead_decode_merge 200 "$py" benchmarks/bench_lmhead_decode.py \
                --only 'MERGE|alone|then logprob|mode A compiled$|^slp warps=4$|^slp CHUNKS' --out "$R" ;;
        lmhead_step)
            part e2e_decode_lmhead 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_lmhead" --only decode \
                --decode-backends stock unified unified-two-pass-lmhead ;;
        lmhead_flat)
            part pytest_gpu_lmhead_flat 120 "$py" -m pytest -q -m gpu tests/kernels/test_sample_logprob.py -k flat
            part lmhead_decode_flat 150 "$py" benchmarks/bench_lmhead_decode.py --out "$R" --only "FLAT|stages|BLOCK_T=32"
            part e2e_decode_flat 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_flat" --only decode \
                --decode-backends unified --decode-variant nested=logprob.FLAT=0,logprob.SLP_STAGES=3 ;;
        lmhead_regs)
            part pytest_gpu_lmhead_regs 150 "$py" -m pytest -q -m gpu tests/kernels/test_sample_logprob.py -k register_cap
            part lmhead_decode_regs 150 "$py" benchmarks/bench_lmhead_decode.py --out "$R" --only "maxnreg|nested 3"
            part e2e_decode_regs 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_regs" --only decode \
                --decode-backends unified --decode-variant uncapped=logprob.SLP_MAXNREG=0 \
                --decode-variant m80s3=logprob.SLP_MAXNREG=80,logprob.SLP_STAGES=3 ;;
        lmhead_bwd)
            part pytest_gpu_lmhead_bwd 200 "$py" -m pytest -q -m gpu tests/kernels/test_logprob.py -k backward_launch
            part speed_lmhead_bwd 300 "$py" benchmarks/bench_speed.py --only ops --out "$R" --rounds 9 --budget-s 240 \
                --variant dzlow=logprob.BWD_DZ_LOW=1 --variant gh64=logprob.BWD_GH_BLOCK_M=64 \
                --variant s5=logprob.BWD_STAGES=5 --variant bk64=logprob.BWD_BLOCK_K=64,logprob.BWD_STAGES=4 \
                --variant dzlow_gh64_s5=logprob.BWD_DZ_LOW=1,logprob.BWD_GH_BLOCK_M=64,logprob.BWD_STAGES=5 ;;
        lmhead_bwd2)
            part pytest_gpu_lmhead_bwd2 200 "$py" -m pytest -q -m gpu tests/kernels/test_logprob.py -k backward_launch
            part speed_lmhead_bwd2 300 "$py" benchmarks/bench_speed.py --only ops --out "$R" --rounds 9 --budget-s 240 \
                --variant fp32=logprob.BWD_DZ_LOW=0 --variant hfast=logprob.BWD_GW_HFAST=1 \
                --variant c2048=logprob.BWD_CHUNK_T=2048 --variant c4096=logprob.BWD_CHUNK_T=4096 \
                --variant hfast_c4096=logprob.BWD_GW_HFAST=1,logprob.BWD_CHUNK_T=4096
            part "train_profile_${CARD}_qwen3-0.6b" 240 "$py" benchmarks/train_profile.py --preset qwen3-0.6b --out "$R" \
                --name "train_profile_${CARD}_qwen3-0.6b" ;;
        train_variants)
            part pytest_gpu_attn_ds 120 "$py" -m pytest -q -m gpu tests/kernels/test_attention_ds.py
            part pytest_gpu_logprob_entropy 120 "$py" -m pytest -q -m gpu tests/kernels/test_logprob.py -k entropy
            part "train_profile_${CARD}_qwen3-0.6b_variants" 300 "$py" benchmarks/train_profile.py --preset qwen3-0.6b \
                --rounds 3 --out "$R" --name "train_profile_${CARD}_qwen3-0.6b_variants" \
                --variant rows32=add_rmsnorm.BWD_ROWS=32,rmsnorm.BWD_ROWS=32 \
                --variant rows64=add_rmsnorm.BWD_ROWS=64,rmsnorm.BWD_ROWS=64 --variant ent=logprob.FWD_ENTROPY=1 \
                --variant ent_uncapped=logprob.FWD_ENTROPY=1,logprob.FWD_ENT_MAXNREG=0 ;;
        decode_regs)
            part pytest_gpu_decode_regs 200 "$py" -m pytest -q -m gpu tests/kernels/test_attention.py -k register_caps
            part e2e_decode_dregs 360 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_dregs" --only decode \
                --decode-backends unified --decode-variant c128=attention.decode_short_maxnreg=128 \
                --decode-variant c168=attention.decode_short_maxnreg=168 \
                --decode-variant w8c64=attention.decode_short_num_warps=8,attention.decode_short_maxnreg=64 \
                --decode-variant narrow50=linear.NARROW_PCT=50 --decode-variant narrow100=linear.NARROW_PCT=100 ;;
        decode_combine)
            part e2e_decode_combine 400 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_combine" --only decode \
                --decode-backends unified --decode-variant fused64=linear.FUSED_MAX_M=64 \
                --decode-variant fused64n50=linear.FUSED_MAX_M=64,linear.NARROW_PCT=50 \
                --decode-variant fused64n32=linear.FUSED_MAX_M=64,linear.M64_BLOCK_N=32,linear.M64_FILL_BLOCK_N=32,linear.NARROW_PCT=0 ;;
        qk_regs)
            part pytest_gpu_qk_regs 240 "$py" -m pytest -q -m gpu tests/e2e/test_rope_cache.py
            part e2e_decode_qk_regs 300 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_qk_regs" --only decode \
                --decode-backends unified unified-qk-regs ;;
        lmhead)
            part lmhead_decode 200 "$py" benchmarks/bench_lmhead_decode.py --out "$R" ;;
        stock_paths)
            part e2e_decode_stock_paths 420 "$py" benchmarks/bench_e2e.py --out "$R/e2e_decode_stock_paths" --only decode \
                --decode-backends stock stock-scatter stock-fill-rows stock-fold-gqa unified ;;
        late)
            part pytest_gpu_late 120 env TIK_LATE_INPUTS=1 "$py" -m pytest -q -m gpu tests/evaluator/test_late_inputs.py
            part pytest_gpu_late_evaluator 300 env TIK_LATE_INPUTS=1 "$py" -m pytest -q -m "gpu and not gpu_timing" \
                tests/evaluator
            part pytest_gpu_late_timing 300 env TIK_LATE_INPUTS=1 "$py" -m pytest -q -m gpu_timing tests/evaluator ;;
        rope_bits)
            part pytest_gpu_rope_bits 240 "$py" -m pytest -q -m gpu tests/e2e/test_rope_cache.py tests/kernels/test_rope.py \
                tests/kernels/test_rmsnorm.py tests/kernels/test_sample_logprob.py tests/kernels/test_logprob.py ;;
        attn_tests)
            part pytest_gpu_attention 300 "$py" -m pytest -q -m gpu tests/kernels/test_attention.py \
                tests/kernels/test_attention_bwd.py tests/kernels/test_attention_ds.py tests/kernels/test_attention_head_dim.py ;;
        prefill)
            # prefill (with the forward's launch choices beside the CONFIG's, --variant) and forward + backward vs SDPA
            # flash; their summary keys in the card's summary (bench_speed's default: $R/summary_<card>.json)
            part speed_prefill 200 "$py" benchmarks/bench_speed.py --only prefill --out "$R" --rounds 9 --budget-s 150 \
                --variant longest=attention.FWD_LONGEST_FIRST=1 \
                --variant m128w8s2=attention.BLOCK_M=128,attention.num_warps=8,attention.num_stages=2 \
                --variant pointers=attention.FWD_TMA=0 --variant two_loops=attention.FWD_ONE_LOOP=0 \
                --variant w8=attention.num_warps=8 --variant in_memory=attention.FWD_TOTAL_IN_MEMORY=1
            part speed_fwdbwd 200 "$py" benchmarks/bench_speed.py --only fwdbwd --out "$R" --rounds 9 --budget-s 150 ;;
        fwd_timeline)
            part attn_fwd_timeline 150 "$py" benchmarks/attn_fwd_timeline.py --out "$R"
            part attn_fwd_timeline_two_loops 150 "$py" benchmarks/attn_fwd_timeline.py --out "$R" --name _two_loops \
                --set FWD_ONE_LOOP=0 ;;
        attn_bwd)
            part attn_bwd 400 "$py" benchmarks/bench_attn_bwd.py --out "$R" ;;
        speed)
            part speed 590 "$py" benchmarks/bench_speed.py --out "$R" ;;
        shared_prompts)
            part "pytest_gpu_${CARD}_shared_prompts" 150 "$py" -m pytest -q -m gpu tests/e2e/test_shared_prompts.py
            for share in shared shared_off; do
                flag=""
                [[ $share == shared_off ]] && flag="--no-share-prompts"
                part "rollout_profile_${CARD}_qwen3-0.6b_$share" 150 "$py" benchmarks/rollout_profile.py \
                    --preset qwen3-0.6b --prompts 32 --group 8 --slots 256 --backends unified --rounds 3 $flag \
                    --out "$R" --name "rollout_profile_${CARD}_qwen3-0.6b_$share"
            done
            part e2e_minibatch_qwen3-0.6b_noshare 200 "$py" benchmarks/bench_e2e.py \
                --out "$R/e2e_minibatch_qwen3-0.6b_noshare" --only throughput --shapes qwen3-0.6b --steps 4 \
                --prompts 32 --group 8 --max-slots 256 --ppo-epochs 1 --minibatches 4 --modes C B --no-share-prompts ;;
        gluon_fwd)
            # pytest-xdist where installed: each form and shape compiles its own kernel, on the host's cores at once
            part "pytest_gpu_${CARD}_gluon_fwd" 300 "$py" -m pytest -q -m gpu $xdist tests/kernels/test_gluon_attn_fwd.py \
                -k "not warp_specialized"
            part gluon_fwd 300 "$py" benchmarks/bench_gluon_fwd.py --out "$R" --rounds 9 ;;
        gluon_root)
            # the root's forward as the Gluon kernel (FWD_GLUON, session 41): its bit tests (the forms and the root's
            # entry points, dense, a [B, S, H, D] view and varlen, against the Triton forward), the attention GPU suite
            # with it, then bench_speed's prefill, forward + backward and varlen cells with the Triton forward beside
            # and the packed Gluon forward (FWD_GLUON_VARLEN, off in the CONFIG until this runs green) as a variant
            part "pytest_gpu_${CARD}_gluon_fwd" 200 "$py" -m pytest -q -m gpu $xdist tests/kernels/test_gluon_attn_fwd.py \
                -k "not warp_specialized"
            # (the attention suite one process at a time, as attn_tests runs it: 147 s on an H100 in session 28)
            part "pytest_gpu_${CARD}_attention_gluon" 300 "$py" -m pytest -q -m gpu tests/kernels/test_attention.py \
                tests/kernels/test_attention_bwd.py tests/kernels/test_attention_ds.py tests/kernels/test_attention_head_dim.py
            part speed_gluon 260 "$py" benchmarks/bench_speed.py --only prefill --only fwdbwd --only varlen --out "$R" \
                --rounds 9 --budget-s 220 --variant triton=attention.FWD_GLUON=0 \
                --variant gluon_varlen=attention.FWD_GLUON_VARLEN=1 ;;
        gluon_fwd_ws)
            part "pytest_gpu_${CARD}_gluon_fwd_ws" 300 "$py" -m pytest -q -m gpu $xdist tests/kernels/test_gluon_attn_fwd.py \
                -k warp_specialized --runxfail
            part gluon_fwd_ws 300 "$py" benchmarks/bench_gluon_fwd.py --ws --out "$R" --rounds 9 ;;
        gluon_linear)
            # pytest-xdist where installed: each form and shape compiles its own kernel, on the host's cores at once
            part "pytest_gpu_${CARD}_gluon_linear" 300 "$py" -m pytest -q -m gpu $xdist tests/kernels/test_gluon_linear_small.py
            part gluon_linear 300 "$py" benchmarks/bench_gluon_linear.py --out "$R" --rounds 9 ;;
        keys)
            part speed 240 "$py" benchmarks/bench_speed.py --out "$R"
            part e2e_decode 200 "$py" benchmarks/bench_e2e.py --out "$R" --only decode
            for preset in qwen3-1.7b qwen3-0.6b; do
                modes="C B"
                [[ $preset == qwen3-1.7b ]] && modes="C B A"
                part "e2e_minibatch_$preset" 260 "$py" benchmarks/bench_e2e.py --out "$R/e2e_minibatch_$preset" \
                    --only throughput --shapes "$preset" --steps 4 --prompts 32 --group 8 --max-slots 256 \
                    --ppo-epochs 1 --minibatches 4 --modes $modes
            done ;;
        hf)
            part hf 300 "$py" benchmarks/bench_hf.py --out "$R" --name hf_${CARD}
            part hf_gpu_test 200 "$py" -m pytest -q -m gpu tests/hf ;;
        *)
            echo "unknown part $p (suite eval_rate eval_rate_prestart3 eval_rate_nosettle eval_rate_OP eval_repeat_OP rvi reply_copy probe_times cheats search_linear search_attention search_pair tuner_linear scaleout scaleout_shared attention e2e e2e_full e2e_minibatch e2e_decode e2e_learning rollout_profile decode_breakdown decode_cuts pdl stock_decode qk_rope overlap narrow lmhead stock_paths train_profile late attn_bwd speed hf lmhead_merge lmhead_step qk_regs prefill attn_tests rope_bits fwd_timeline lmhead_flat lmhead_regs lmhead_bwd lmhead_bwd2 train_variants prefill_chunks decode_regs decode_combine mlp_fused linear_small linear_k4096 linear_one_chunk linear_swap linear_walk varlen keys gluon_fwd gluon_root gluon_fwd_ws gluon_linear shared_prompts)" >&2 ;;
    esac
done
