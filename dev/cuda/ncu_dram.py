"""ncu_dram.py -- per-kernel time and DRAM traffic from ncu text output, and the achieved bandwidth.

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        -s SKIP -c COUNT ./attn_bwd sparse1 0.01 > LOG
    python3 dev/cuda/ncu_dram.py LOG

Prints, in launch order, each kernel's name, duration (us), DRAM bytes read and written (MB) and
their sum over the duration (TB/s): whether a stage of a backward call is bound by memory traffic.
"""
import re
import sys

TIME = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}


def main():
    rows, cur = [], None
    for line in open(sys.argv[1], errors="replace"):
        m = re.match(r"\s+(?:void )?(?:\w+::)*(\w+)(?:<[^(]*>)?\(.*\) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if m:
            cur = {"name": m.group(1)}
            rows.append(cur)
            continue
        m = re.search(r"(gpu__time_duration\.sum|dram__bytes_read\.sum|dram__bytes_write\.sum)\s+(\w+)\s+([\d.,]+)", line)
        if m and cur is not None:
            v = float(m.group(3).replace(",", ""))
            key = m.group(1).split(".")[0].split("__")[1]
            cur[key] = v * (TIME if key == "time_duration" else BYTES).get(m.group(2), float("nan"))
    for r in rows:
        t, rd, wr = r.get("time_duration", 0), r.get("bytes_read", 0), r.get("bytes_write", 0)
        bw = (rd + wr) / t if t else 0.0  # MB / us = TB/s
        print(f"{r['name']:40s} {t:9.1f} us  read {rd:8.1f} MB  write {wr:8.1f} MB  {bw:5.2f} TB/s")


if __name__ == "__main__":
    main()
