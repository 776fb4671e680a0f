"""Developer tool: the report of a forward kernel's clock stamps (`FLASH_FWD_DEV_TRACE=1` builds,
csrc/kernel/common/trace.h). Reads the printed `TRACE role event clock` and `CTA i start end` lines
and prints, per role (0: producer, 1 / 2: consumer warpgroups), the median and share of every
interval between consecutive events, then the tile period and the spread of the CTAs' ends.

    python3 tools/profile/profile_case.py --fp8 --hdim 128 --seqlen 4096 --runs 4 > stamps.txt
    python3 tools/profile/trace_report.py stamps.txt [--tiles 2048]
"""
import argparse
import collections
import statistics

EVENTS = {1: "Load", 2: "Q", 3: "VLanded", 4: "VtFree", 5: "TDone", 10: "Tile", 11: "QReady", 12: "Turn",
          13: "K", 14: "V", 15: "S", 16: "PV", 17: "Epi"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stamps")
    ap.add_argument("--tiles", type=int, default=0, help="the launch's tiles: CTAs' ends grouped by tile count")
    args = ap.parse_args()
    roles, ctas = collections.defaultdict(list), []
    for line in open(args.stamps):
        f = line.split()
        if f[:1] == ["TRACE"]:
            roles[int(f[1])].append((EVENTS.get(int(f[2]), f[2]), int(f[3])))
        elif f[:1] == ["CTA"]:
            ctas.append((int(f[1]), int(f[2]), int(f[3])))
    for role in sorted(roles):
        seq = roles[role]
        gaps = collections.defaultdict(list)
        for (a, ta), (b, tb) in zip(seq, seq[1:]):
            gaps[(a, b)].append(tb - ta)
        total = sum(sum(v) for v in gaps.values()) or 1
        print(f"role {role}: {len(seq)} stamps over {seq[-1][1] - seq[0][1]} cycles")
        for (a, b), v in sorted(gaps.items(), key=lambda kv: -sum(kv[1])):
            if sum(v) >= 0.01 * total:
                print(f"  {a:>8s} -> {b:<8s} n={len(v):5d}  median {statistics.median(v):7.0f}  {100 * sum(v) / total:5.1f} %")
        starts = [t for e, t in seq if e == "Tile"]
        if len(starts) > 2:
            print(f"  tile period: median {statistics.median(b - a for a, b in zip(starts, starts[1:])):.0f} cycles")
    if ctas:
        t0, t1 = min(c[1] for c in ctas), max(c[2] for c in ctas)
        busy = sum(c[2] - c[1] for c in ctas)
        print(f"{len(ctas)} CTAs: span {(t1 - t0) / 1e3:.1f} us, idle {100 * (1 - busy / (len(ctas) * (t1 - t0))):.1f} %")
        if args.tiles:
            g = len(ctas)
            by = collections.defaultdict(list)
            for i, _, end in ctas:
                by[len(range(i, args.tiles, g))].append((end - t0) / 1e3)
            for k, ends in sorted(by.items()):
                print(f"  {len(ends)} CTAs with {k} tiles end at {min(ends):.1f}-{max(ends):.1f} us "
                      f"(median {statistics.median(ends):.1f})")


if __name__ == "__main__":
    main()
