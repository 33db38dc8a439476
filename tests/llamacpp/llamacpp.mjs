// Drive a real llama.cpp (the prebuilt CPU binaries of npm node-llama-cpp) for wf_nb's tests and benchmarks.
// Usage: node llamacpp.mjs < request.json > reply.json
// request: {"model": PATH, "threads": 1, "ctx": 512, "ops": [OP, ...]} with OP one of
//   {"op": "tokenize", "texts": [...]}                      -> {"tokens": [[ids], ...]}  (special tokens parsed, no BOS)
//   {"op": "logprobs", "tokens": [ids]}                     -> {"logprobs": [log p(t[i+1] | t[..i])], "top1": [argmax]}
//   {"op": "generate", "tokens": [ids], "n": N}             -> {"tokens": [greedy ids]}
//   {"op": "bench", "tokens": [ids], "n": N}                -> {"prefill_tps", "decode_tps", "generated"} (N tokens, EOS or not)
// The package is found in $WF_NODE_LLAMA_CPP (the folder npm installed it into) or ~/.cache/wf_nb/node-llama-cpp.
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const dir = process.env.WF_NODE_LLAMA_CPP || join(homedir(), ".cache", "wf_nb", "node-llama-cpp");
const { getLlama } = await import(pathToFileURL(join(dir, "node_modules", "node-llama-cpp", "dist", "index.js")).href);
const req = JSON.parse(readFileSync(0, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error", progressLogs: false });
const t0 = performance.now();
const model = await llama.loadModel({ modelPath: req.model, gpuLayers: 0 });
const out = { load_s: (performance.now() - t0) / 1000, results: [] };
const threads = req.threads || 1, contextSize = req.ctx || 512;
const full = { temperature: 1, topK: 0, topP: 1, minP: 0 };   // the plain softmax: no sampler trims the distribution

async function fresh() {
  const context = await model.createContext({ contextSize, threads, batchSize: contextSize, sequences: 1 });
  return [context, context.getSequence()];
}

for (const op of req.ops) {
  if (op.op === "tokenize") {
    out.results.push({ tokens: op.texts.map((t) => Array.from(model.tokenize(t, true))) });
  } else if (op.op === "logprobs") {
    const [context, seq] = await fresh();
    const items = op.tokens.slice(0, -1).map((t) => [t, { generateNext: { probabilities: true, options: full } }]);
    const lp = [], top = [];
    // in chunks on one sequence (its KV cache carries the context on): a vocabulary-sized map per position would
    // exhaust node's heap over a few thousand positions, so each chunk's maps are dropped once read
    for (let s = 0; s < items.length; s += 256) {
      const res = await seq.controlledEvaluate(items.slice(s, s + 256));
      res.forEach((r, j) => {
        lp.push(Math.log(r.next.probabilities.get(op.tokens[s + j + 1]) ?? 0));
        top.push(r.next.probabilities.keys().next().value);   // the map is sorted, most probable first
      });
    }
    out.results.push({ logprobs: lp, top1: top });
    await context.dispose();
  } else if (op.op === "generate" || op.op === "bench") {
    const [context, seq] = await fresh();
    const toks = [];
    let t1 = performance.now(), t2 = null;
    // bench: exactly n tokens (an end-of-generation token does not stop it, as min_new_tokens on the torch side)
    for await (const t of seq.evaluate(op.tokens, { temperature: 0, yieldEogToken: op.op === "bench" })) {
      if (t2 === null) t2 = performance.now();   // the first token comes right after the prompt's forward
      toks.push(t);
      if (toks.length >= op.n) break;
    }
    const t3 = performance.now();
    if (op.op === "generate") out.results.push({ tokens: toks });
    else out.results.push({ prefill_tps: op.tokens.length / ((t2 - t1) / 1000),
                            decode_tps: (toks.length - 1) / ((t3 - t2) / 1000), generated: toks.length });
    await context.dispose();
  } else throw new Error(`unknown op ${op.op}`);
}
// peak RSS of this process: VmHWM (reset at exec; resourceUsage().maxRSS would include the parent's peak)
out.max_rss_mb = Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))[1]) / 1024;
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
