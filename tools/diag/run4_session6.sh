export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MAX_JOBS=16 bash tools/gpu_check.sh --no-bench --tests "tests/test_small_seq_gpu.py -rxXf"
python3 tools/profile_small_seq_host.py --calls 1000 > $OUT/host_profile.log 2>&1; head -12 $OUT/host_profile.log
python3 tools/bench_small_seq.py --cases h1_d128_kv4 > $OUT/bench_h1.log 2>&1; tail -1 $OUT/bench_h1.log
for v in 8 16 4; do ROCM_ATTN_THD_COPY_VECS_PER_LANE=$v python3 tools/bench_thd.py --no-progress --cases b16_s4096_cp2,b16_s4096_cp8,var64_cp4 > $OUT/thd_vpl$v.log 2>&1; echo "vecs per lane $v"; grep -E "partition|reorder|read_half |copy_valid" $OUT/thd_vpl$v.log; done
