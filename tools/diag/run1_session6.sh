export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MAX_JOBS=16 bash tools/gpu_check.sh --no-thd-bench --bench-cases h1_d128_kv4 --tests "tests/test_small_seq_gpu.py -k raw_op_checks -rxX"
gcc -shared -fPIC -O0 -g -o /tmp/sb.so tools/diag/segv_backtrace.c
python3 -c "from tests.test_small_seq_gpu import _RAW_OP_PROBE as p; open('/tmp/probe.py','w').write(p)"
for w in "head dim" "cu_seqlens_kv" "k head dim" "max_seqlen_kv"; do
  echo "=== probe $w"; LD_PRELOAD=/tmp/sb.so python3 /tmp/probe.py "$w" > $OUT/probe.log 2>&1; echo "rc=$?"; grep -v "^\s*$" $OUT/probe.log | tail -45
done
python3 tools/profile_small_seq_host.py 2>&1 | tee $OUT/host_profile.log
