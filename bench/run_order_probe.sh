#!/usr/bin/env bash
# run_order_probe.sh -- one device call: build the library, run bench/bench_order.py on the two
# 16k shapes whose figures moved with the timing order, with nvidia-smi logging the SM clock,
# power and clock-event reasons every 50 ms beside it (0x4 = SW power cap); the forward checker
# builds and runs its float64 check at the end. Logs in $OUT. Usage (repo root, GPU machine):
#   bash bench/run_order_probe.sh
O=${OUT:-out}; mkdir -p "$O"; nvidia-smi -q -d POWER,CLOCK,PERFORMANCE > $O/smi-q.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $O/smi.csv 2>&1 &
SMI=$!
(cmake -S . -B build -G Ninja -DBL_BUILD_TESTS=OFF && cmake --build build -j 16) > $O/build.txt 2>&1 || { tail -30 $O/build.txt; exit 1; }
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --use_fast_math -Xcompiler -fopenmp -I include -I src -I src/cuda dev/cuda/attn_fwd.cu -o build/attn_fwd > $O/fwdbuild.txt 2>&1 & NVPID=$!
export BACK_LITE_LIBRARY=$PWD/build/libbacklite.so PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 bench/bench_order.py --shape 1 16384 16 128 2>&1 | tee $O/order-16k-128.txt
python3 bench/bench_order.py --shape 1 16384 16 64 2>&1 | tee $O/order-16k-64.txt
wait $NVPID; OMP_NUM_THREADS=16 timeout 120 build/attn_fwd check 2>&1 | tail -4 | tee $O/fwdcheck.txt
kill $SMI
