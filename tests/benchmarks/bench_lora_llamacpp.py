"""A trained adapter run served in the real llama.cpp (issue 37): `wf export RUN --format gguf --out DIR` writes the base's
GGUF and the adapter's (fitted to each other), node-llama-cpp scores the genre task's label log-probs with and without the
adapter, and wf_nb scores the same prompts with base + adapter and the base alone. Prints accuracy, the share of
predictions equal to wf_nb's and the mean |label log-prob difference|, per scorer.

    python tests/benchmarks/bench_lora_llamacpp.py RUN --n 150 [--out DIR] [--embed-type q8_0]

RUN: a `wf train -s 3|sft ... peft.method=lora data.task=shakespeare_genre` run (its folder, or its `final/`).
node-llama-cpp as tests/test_llamacpp.py installs it (WF_NODE_LLAMA_CPP, default ~/.cache/wf_nb/node-llama-cpp).
"""
import argparse, json, os, subprocess, tempfile, time
from pathlib import Path
import torch

NLC = Path(os.environ.get('WF_NODE_LLAMA_CPP', Path.home() / '.cache' / 'wf_nb' / 'node-llama-cpp'))
SCRIPT = r'''
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
const { getLlama } = await import(pathToFileURL(join(process.env.WF_NODE_LLAMA_CPP, "node_modules", "node-llama-cpp", "dist", "index.js")).href);
const req = JSON.parse(readFileSync(process.argv[2], "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error", progressLogs: false });
const model = await llama.loadModel({ modelPath: req.model, gpuLayers: 0 });
const context = await model.createContext({ contextSize: 256, threads: 1, batchSize: 256, sequences: 1,
                                             ...(req.lora ? { lora: { adapters: [{ filePath: req.lora, scale: 1 }] } } : {}) });
const full = { temperature: 1, topK: 0, topP: 1, minP: 0 };
const out = [];
for (const tokens of req.prompts) {   // the next-token distribution after each prompt: the log-prob of each label token
  const seq = context.getSequence();
  const res = await seq.controlledEvaluate(tokens.map((t, i) => (i == tokens.length - 1 ? [t, { generateNext: { probabilities: true, options: full } }] : t)));
  const p = res[tokens.length - 1].next.probabilities;
  out.push(req.labels.map((l) => Math.log(p.get(l) ?? 1e-30)));
  await seq.clearHistory(); seq.dispose();
}
console.log(JSON.stringify(out));
'''


def llamacpp_logprobs(work: Path, model: Path, lora: Path | None, prompts: list, labels: list) -> torch.Tensor:
    "`[N, n_labels]` label log-probs from llama.cpp after each prompt (one token per label)."
    (work/'score.mjs').write_text(SCRIPT)
    (work/'req.json').write_text(json.dumps(dict(model=str(model), lora=str(lora) if lora else None, prompts=prompts, labels=labels)))
    r = subprocess.run(['node', str(work/'score.mjs'), str(work/'req.json')], capture_output=True, text=True,
                       env={**os.environ, 'WF_NODE_LLAMA_CPP': str(NLC)})
    if r.returncode != 0: raise SystemExit(f"node-llama-cpp failed:\n{r.stderr[-3000:]}")
    return torch.tensor(json.loads(r.stdout.strip().splitlines()[-1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('run'); ap.add_argument('--n', type=int, default=150, help='genre test passages, spread over the split')
    ap.add_argument('--out', default=None, help='the export folder (written if missing; default: a temporary one)')
    ap.add_argument('--embed-type', default='q8_0'); ap.add_argument('--max-len', type=int, default=128)
    a = ap.parse_args()
    from transformers import AutoTokenizer
    from wf_nb.tasks import shakespeare_genre, GENRE_TASK, encode_classification, label_logprobs
    from wf_nb.lora import load_adapter, load_frozen, adapter_base, export_adapter, is_adapter_dir
    run = Path(a.run); adapter = run if is_adapter_dir(run) else run/'final'
    base = adapter_base(adapter); tok = AutoTokenizer.from_pretrained(base)
    work = Path(tempfile.mkdtemp())
    out = Path(a.out) if a.out else work/'served'
    if not (out/'adapter.gguf').exists(): export_adapter(adapter, 'gguf', out, embed_type=a.embed_type)
    test = shakespeare_genre('test'); step = max(1, len(test) // a.n); ex = test[::step][:a.n]
    label_ids = [tok(GENRE_TASK.target(l), add_special_tokens=False).input_ids for l in GENRE_TASK.labels]
    assert all(len(t) == 1 for t in label_ids), label_ids
    prompts = [encode_classification(tok, e['text'], e['label'], GENRE_TASK, a.max_len, eos=False)['input_ids'][:-1] for e in ex]
    gold = torch.tensor([GENRE_TASK.labels.index(e['label']) for e in ex])
    rows, t0 = {}, time.time()
    with torch.no_grad():
        rows['wf_nb, base + adapter'] = label_logprobs(load_adapter(base, adapter), tok, ex, GENRE_TASK, a.max_len, 8).float()
        rows['wf_nb, base alone'] = label_logprobs(load_frozen(base), tok, ex, GENRE_TASK, a.max_len, 8).float()
    labels = [t[0] for t in label_ids]
    rows['llama.cpp, base.gguf + adapter.gguf'] = llamacpp_logprobs(work, out/'base.gguf', out/'adapter.gguf', prompts, labels)
    rows['llama.cpp, base.gguf alone'] = llamacpp_logprobs(work, out/'base.gguf', None, prompts, labels)
    ref = {k: rows['wf_nb, base alone' if 'alone' in k else 'wf_nb, base + adapter'] for k in rows}
    print(f"n = {len(ex)} genre test passages (every {step}th), max_len {a.max_len}, {a.embed_type} embedding; {time.time() - t0:.0f} s")
    print('| scorer | accuracy | same prediction as wf_nb | mean abs diff of label log-probs vs wf_nb |\n|---|---|---|---|')
    for k, lp in rows.items():
        same = (lp.argmax(1) == ref[k].argmax(1)).float().mean().item()
        print(f"| {k} | {(lp.argmax(1) == gold).float().mean():.3f} | {same:.1%} | {(lp - ref[k]).abs().mean():.4f} |")


if __name__ == '__main__': main()
