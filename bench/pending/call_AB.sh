# Call AB (thirty-eighth session): why the union kernel's key list takes ~7 us a CTA at B1 L131072 T16
# even on lists of -1 only (call AA's empty-list trace): ncu's per-SASS stall samples of the union
# kernel (the second call, caches as the trace had them, and a cold one), real and empty lists.
# Carry .whl_kgen; ~4 min with the start.
set -u
t0=$SECONDS
source bench/pending/steps.sh
sp=(python3 -m bench.profile_one --spec specs/glm5_dsa_sm120.yaml --shape 1,16,131072)
for v in real_warm:"--cache-control none":"" empty_warm:"--cache-control none":"--empty-lists" \
         empty_cold:"--cache-control all":"--empty-lists"; do
  IFS=: read -r name cc extra <<< "$v"
  # shellcheck disable=SC2086
  step "ncu_$name" 120 ncu --clock-control none $cc --set full --import-source no -k regex:sparse_verify \
      --launch-skip 1 -c 1 -f -o "/tmp/ncu_$name" "${sp[@]}" --calls 3 $extra
  ncu -i "/tmp/ncu_$name.ncu-rep" --page details --csv > "$OUT/ncu_${name}_details.csv" 2>&1
  ncu -i "/tmp/ncu_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${name}_sass.csv" 2>&1
  gzip -f "$OUT/ncu_${name}_sass.csv"
done
echo "done: $((SECONDS - t0)) s" >> "$OUT/summary.log"
