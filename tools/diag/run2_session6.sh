export PATH=/opt/torch/.venv/bin:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
ls /opt/gcc/lib64/ 2>/dev/null | grep -i stdc | head; /opt/gcc/bin/g++ --version | head -1; /opt/gcc/bin/g++ -print-file-name=libstdc++.so
MAX_JOBS=16 bash tools/gpu_check.sh --bench-cases h1_d128_kv4 --tests "tests/test_small_seq_gpu.py tests/test_thd_gpu.py -rxXf"
nm -D --defined-only rocm_attn/_C*.so | grep -c "_ZNSo9_M_insert" ; ldd rocm_attn/_C*.so | grep stdc
python3 tools/profile_small_seq_host.py --calls 1000 2>&1 | head -12 | tee $OUT/host_profile.log
