"""Reads `loom train --memory-json` output (stdin; other lines ignored) and checks it: every
rank of the world (argv[1] ranks) gives one line per memory tag, with peak_bytes >= current_bytes,
and, for an fp32 run over data parallelism (ZeRO 0 or 1, whole gradients on every rank), AdamW's
two f32 moments summed over the dp ranks are twice one rank's gradients (8 bytes per parameter
against 4: the optimizer state is sharded exactly, or held whole at dp = 1).
Prints "memory_json: ..." when everything holds, else exits 1 saying what did not."""
import json
import sys

TAGS = ["params", "grads", "master", "optimizer", "activations", "comm", "kv_cache", "workspace"]


def main():
    world = int(sys.argv[1])
    ranks = {}
    for line in sys.stdin:
        if not line.startswith('{"world_rank"'):
            continue
        j = json.loads(line)
        ranks.setdefault(j["world_rank"], {})[j["tag"]] = j
    fail = []
    if sorted(ranks) != list(range(world)):
        fail.append(f"ranks {sorted(ranks)}, expected 0..{world - 1}")
    for r, tags in ranks.items():
        if sorted(tags) != sorted(TAGS):
            fail.append(f"rank {r}: tags {sorted(tags)}")
        for t in tags.values():
            if not (0 <= t["current_bytes"] <= t["peak_bytes"]):
                fail.append(f"rank {r} {t['tag']}: current {t['current_bytes']} > peak {t['peak_bytes']}")
    if not fail:
        optimizer = sum(tags["optimizer"]["peak_bytes"] for tags in ranks.values())
        grads = ranks[0]["grads"]["peak_bytes"]
        if optimizer != 2 * grads:
            fail.append(f"optimizer state over the ranks {optimizer} bytes, expected 2 x grads = {2 * grads}")
    if fail:
        print("memory_json: " + "; ".join(fail))
        sys.exit(1)
    print(f"memory_json: {world} rank(s), {len(TAGS)} tags each; optimizer state {optimizer} bytes = 2 x grads")


main()
