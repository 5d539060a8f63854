#!/usr/bin/env bash
# Does steering PPO keep the shop assistant from getting worse (issue 27, item 2)? Three seeds
# (each its own warm-up), 30 PPO iterations of the conf/shop.yaml recipe, dev evaluated every 5:
#   last   the last policy (what the recipe gave before dev selection)          eval_last.json
#   select the best policy on dev (ppo.dev_every=5)                             final/
#   steer  dev selection + adaptive KL (target 0.05) + 5 iterations of LR warm-up
#   grpo   dev selection with GRPO (4 samples per question), trajectory-weighted loss
# Usage: bash docs/experiments/2026-12-02-steering.sh OUT_DIR     (~25 min on 2 cores)
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
common=(-o ppo.iterations=30 -o ppo.checkpoint_every=10 -o ppo.dev_every=5 -o data.dir="$out/data-shop")
for seed in 0 1 2; do
  agentr1 train --config conf/shop.yaml "${common[@]}" -o seed=$seed -o output_dir="$out/select-$seed" >/dev/null
  agentr1 evaluate --config conf/shop.yaml -o seed=$seed -o data.dir="$out/data-shop" \
    --checkpoint "$out/select-$seed/checkpoints/last/policy" --data "$out/data-shop" --out "$out/select-$seed/last" \
    > "$out/select-$seed/eval_last.json"
  for variant in steer grpo; do
    run="$out/$variant-$seed"
    mkdir -p "$run" && cp -r "$out/select-$seed/warmup" "$out/select-$seed/.agentr1-run" "$run/"
    case $variant in
      steer) extra=(-o ppo.kl_target=0.05 -o ppo.lr_warmup_iters=5) ;;
      grpo) extra=(-o ppo.estimator=grpo -o ppo.group_size=4 -o ppo.loss_weighting=trajectory) ;;
    esac
    agentr1 train --config conf/shop.yaml "${common[@]}" "${extra[@]}" -o seed=$seed -o output_dir="$run" >/dev/null
  done
done
python - "$out" <<'PY'
import json, statistics as st, sys
from pathlib import Path
out = Path(sys.argv[1])
def ms(xs): return f"{st.mean(xs):.3f} ± {st.stdev(xs):.3f}"
rows = {"warm-up": [], "last (no selection)": [], "select": [], "steer": [], "grpo": []}
picked = {k: [] for k in ("select", "steer", "grpo")}
for seed in range(3):
    s = json.loads((out / f"select-{seed}/summary.json").read_text())
    rows["warm-up"].append(s["warmup"])
    rows["last (no selection)"].append(json.loads((out / f"select-{seed}/eval_last.json").read_text()))
    for v in picked:
        s = json.loads((out / f"{v}-{seed}/summary.json").read_text())
        rows[v].append(s["final"])
        picked[v].append(f"{s['selected']['iteration']}/{s['iterations']}")
print("| policy | greedy EM | sampled EM | iteration picked / run |\n|---|---|---|---|")
for name, ms_ in rows.items():
    print(f"| {name} | {ms([m['greedy/em'] for m in ms_])} | {ms([m['sampled/em'] for m in ms_])} | "
          f"{', '.join(picked.get(name, []))} |")
PY
