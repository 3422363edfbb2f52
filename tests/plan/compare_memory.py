"""loom plan's prediction against what loom train measured: reads two outputs of JSON lines
(argv[1]: loom plan --json; argv[2]: loom train --memory-json, other lines ignored) and requires
the same ranks and tags with equal current_bytes and peak_bytes. argv[3] names the layout.
Prints "plan = train: LAYOUT (N ranks x T tags)" or each difference, then exits 1."""
import json
import sys


def lines(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith('{"world_rank"'):
                j = json.loads(line)
                out[(j["world_rank"], j["tag"])] = j
    return out


def main():
    plan, train, layout = lines(sys.argv[1]), lines(sys.argv[2]), sys.argv[3]
    diffs = []
    if sorted(plan) != sorted(train):
        diffs.append(f"plan has {sorted(set(plan) - set(train))} more, train {sorted(set(train) - set(plan))} more")
    for key in sorted(set(plan) & set(train)):
        p, t = plan[key], train[key]
        for field in ("peak_bytes", "current_bytes"):
            if p[field] != t[field]:
                diffs.append(f"rank {key[0]} {key[1]} {field}: plan {p[field]}, train {t[field]}")
    if diffs or not plan:
        print(f"plan != train: {layout}: " + ("; ".join(diffs) if diffs else "no lines"))
        sys.exit(1)
    ranks = len({k[0] for k in plan})
    print(f"plan = train: {layout} ({ranks} ranks x {len(plan) // ranks} tags)")


main()
