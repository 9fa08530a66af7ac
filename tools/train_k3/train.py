#!/usr/bin/env python3
"""Trains the K3-architecture fortune model, quantizes its routed experts to MXFP4, evaluates, and exports it in
the published K3 checkpoint layout.

  python3 tools/train_k3/train.py --data DIR --out OUT [--seed 0] [--steps N] [--time-budget S]

DIR is what prepare_data.sh writes (train.txt, valid.txt, heldout.txt); the tokenizer is the committed one
(tools/train_k3/tokenizer, equal to DIR/tokenizer when DIR was prepared from the same packages). OUT receives:
  model/          the checkpoint (config.json, shards, index, tiktoken.model, tokenizer_config.json)
  metrics.json    config, parameter count, sizes, steps, time, the perplexities, greedy samples
  train.log       the log; loss.png the loss curves (when matplotlib is installed)

Training: AdamW with warm-up and cosine decay on windows of --seq tokens cut from the shuffled documents
(fortune-file text, and a --chat-frac share of documents wrapped as K3 chat conversations), bf16 autocast on a
GPU, float32 on the CPU; the router's selection bias follows the auxiliary-loss-free balance rule. The
checkpoint with the lowest valid loss is kept. Without --steps, the step count is min(--epochs of data, what
fits --time-budget at the speed of the first steps); the log and metrics.json record it, and --steps N with the
same seed and data repeats the run (up to the GPU's non-deterministic reductions).

Quantization: post-training MXFP4 of the routed experts (mxfp4.py), then --qat-steps of quantization-aware
fine-tuning (straight-through fake quantization of the experts); both are evaluated and the one with the lower
valid loss is exported.

Perplexity protocol (heldout and valid alike, and what the engine's perplexity must reproduce): the file's text is
encoded with tiktoken encode_ordinary (no specials), cut into consecutive windows of --eval-window tokens (the
last one shorter), each window run from an empty state; every token of a window but the first is predicted;
perplexity = exp(total NLL / predicted tokens).
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat  # noqa: E402
import export  # noqa: E402
import fortunes  # noqa: E402
import mxfp4  # noqa: E402
import tokenizer  # noqa: E402
from model import K3, K3Config, count_params  # noqa: E402


class Log:
    def __init__(self, path):
        self.f = open(path, "w")

    def __call__(self, *a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.f.write(s + "\n")
        self.f.flush()


# ------------------------------------------------------------------------------------------------- data ----

class Data:
    def __init__(self, tok, train_text, chat_frac, seed):
        self.tok = tok
        self.docs = fortunes.split_docs(train_text)
        self.plain = tok.encode_batch([d + fortunes.SEPARATOR for d in self.docs])
        self.cache = {}
        for d, ids in zip(self.docs, tok.encode_batch(self.docs)):
            self.cache[d] = ids
        self.chat_frac = chat_frac
        self.rng = random.Random(seed)
        self.tokens_plain = sum(map(len, self.plain))

    def epoch_streams(self):
        """One pass over the documents in a new order: a chat_frac share of them (in ones and twos) wrapped as
        chats, the rest as fortune-file text. Plain text and chats form two streams, cut into windows separately,
        so a window of fortunes never runs into chat markup and plain generation keeps writing fortunes."""
        order = list(range(len(self.docs)))
        self.rng.shuffle(order)
        plain, chats, i = [], [], 0
        while i < len(order):
            if self.rng.random() < self.chat_frac:
                n = 2 if self.rng.random() < 0.3 and i + 1 < len(order) else 1
                msgs, thinking = chat.conversation([self.docs[j] for j in order[i:i + n]], self.rng)
                chats.append(chat.encode(self.tok, chat.segments(msgs, thinking=thinking), self.cache))
                i += n
            else:
                plain.append(self.plain[order[i]])
                i += 1
        flat = lambda parts: torch.tensor([t for p in parts for t in p], dtype=torch.long)
        return flat(plain), flat(chats), len(chats)

    def epoch_batches(self, batch, seq):
        plain, chats, nchat = self.epoch_streams()
        wins = []
        for stream in (plain, chats):
            off = self.rng.randrange(seq)
            n = max(0, (len(stream) - off) // (seq + 1))
            wins.append(stream[off:off + n * (seq + 1)].view(n, seq + 1))
        win = torch.cat(wins)
        perm = torch.randperm(len(win), generator=torch.Generator().manual_seed(self.rng.randrange(1 << 30)))
        win = win[perm]
        nb = len(win) // batch
        return win[: nb * batch].view(nb, batch, seq + 1), nchat


def eval_windows(ids, window):
    """The perplexity protocol's windows: [ids[i:i+window]] for consecutive i, the last one shorter, >= 2 tokens."""
    out = [ids[i:i + window] for i in range(0, len(ids), window)]
    return [w for w in out if len(w) >= 2]


@torch.no_grad()
def evaluate(model, wins, device, batch=16, autocast=None):
    """(total NLL, predicted tokens) over the windows, float32 unless autocast is a dtype."""
    model.eval()
    nll, cnt = 0.0, 0
    full = [w for w in wins if len(w) == len(wins[0])]
    rest = [w for w in wins if len(w) != len(wins[0])]
    groups = [full[i:i + batch] for i in range(0, len(full), batch)] + [[w] for w in rest]
    for g in groups:
        x = torch.tensor(g, dtype=torch.long, device=device)
        with torch.autocast(device_type=device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        nll += loss.item()
        cnt += x[:, 1:].numel()
    return nll, cnt


def ppl(nll_cnt):
    return math.exp(nll_cnt[0] / nll_cnt[1])


@torch.no_grad()
def greedy(model, ids, n, device, stop=()):
    model.eval()
    x = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([x], device=device))[0, -1].float()
        t = int(logits.argmax())
        x.append(t)
        if t in stop:
            break
    return x[len(ids):]


# ------------------------------------------------------------------------------------------------ train ----

def param_groups(model, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.dim() >= 2 and "conv1d" not in name and not name.endswith("_res_proj.weight"):
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


class Schedule:
    """Warm-up, a constant stretch, then a linear decay to min_frac of the peak (warmup-stable-decay). The decay
    starts at decay_start, which is either given, or set when the valid loss has not improved for `patience`
    evaluations (past 2 epochs), or falls at (1 - decay_frac) of the step budget; the decay then lasts
    decay_frac / (1 - decay_frac) of the steps before it (at least one epoch), within the budget."""

    def __init__(self, peak, warmup, min_frac, decay_frac, total=None, decay_start=None):
        self.peak, self.warmup, self.min_frac, self.decay_frac = peak, warmup, min_frac, decay_frac
        self.total, self.decay_start, self.budget = total, decay_start, total
        if total is not None and decay_start is None:
            self.decay_start = int(total * (1 - decay_frac))

    def set_budget(self, budget):
        self.budget = self.total = budget
        if self.decay_start is None:
            self.decay_start = int(budget * (1 - self.decay_frac))

    def start_decay(self, step, steps_per_epoch):
        if self.decay_start is not None and self.decay_start <= step:
            return False
        length = max(steps_per_epoch, round(step * self.decay_frac / (1 - self.decay_frac)))
        self.decay_start = step
        self.total = min(self.budget, step + length) if self.budget else step + length
        return True

    def lr(self, step):
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if self.decay_start is None or step < self.decay_start:
            return self.peak
        p = min(1.0, (step - self.decay_start) / max(1, self.total - self.decay_start))
        return self.peak * (1 - (1 - self.min_frac) * p)


def flops_per_token(c, seq):
    """Forward FLOPs per token (2 per multiply-add) of the matmuls and attention, experts as computed (all E)."""
    D = c.hidden_size
    f = 2 * D * c.vocab_size
    for l in range(c.num_layers):
        if c.is_mla(l):
            qh = c.qk_nope_head_dim + c.qk_rope_head_dim
            Hm = c.num_attention_heads
            f += 2 * (D * c.q_lora_rank + c.q_lora_rank * Hm * qh + D * (c.kv_lora_rank + c.qk_rope_head_dim) +
                      c.kv_lora_rank * Hm * (c.qk_nope_head_dim + c.v_head_dim) + 2 * D * Hm * c.v_head_dim)
            f += 2 * Hm * (qh + c.v_head_dim) * seq / 2  # causal attention, average context seq / 2
        else:
            P = c.kda_num_heads * c.kda_head_dim
            dk = c.kda_head_dim
            f += 2 * (5 * D * P + D * dk + dk * P + D * c.kda_num_heads)
            f += 2 * c.kda_num_heads * (4 * dk * dk + 3 * dk * 16)  # chunked delta rule, C = 16
        if c.is_moe(l):
            R, Fi = c.routed_expert_hidden_size, c.moe_intermediate_size
            f += 2 * (D * c.num_experts + 2 * D * R + 3 * D * c.num_shared_experts * Fi + c.num_experts * 3 * R * Fi)
        else:
            f += 2 * 3 * D * c.intermediate_size
    return f


def train_loop(model, data, args, device, log, sched, start_step=0, quant=False, history=None, valid_wins=None,
               deadline=None, patience=0):
    """Trains under the schedule; with sched.total None the step budget is set after 20 steps, from the speed of
    those steps, --time-budget and --epochs. Returns (steps, (best valid loss, state, step), steps per epoch,
    tokens, seconds)."""
    opt = torch.optim.AdamW(param_groups(model, args.wd), lr=sched.peak, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    amp = device.type == "cuda"
    best = (float("inf"), None, -1)
    since_best = 0
    step, t0, tokens = 0, time.time(), 0
    run_loss, run_n = 0.0, 0
    tag = "qat " if quant else ""
    while sched.total is None or step < sched.total:
        batches, nchat = data.epoch_batches(args.batch, args.seq)
        spe = len(batches)
        batches = batches.to(device)
        for b in range(spe):
            if sched.total is not None and step >= sched.total:
                break
            x = batches[b]
            lr = sched.lr(step)
            for gr in opt.param_groups:
                gr["lr"] = lr
            model.train()
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            model.update_router_bias(args.bias_rate)
            step += 1
            tokens += x[:, 1:].numel()
            lv = loss.item()
            run_loss += lv
            run_n += 1
            if history is not None:
                history["train"].append((start_step + step, lv))
            if sched.total is None and step == 20:
                dt = (time.time() - t0) / step
                budget = deadline - time.time() if deadline else float("inf")
                by_time = step + int(budget / dt)
                by_epochs = int(args.epochs * spe)
                sched.set_budget(max(step + 1, min(by_time, by_epochs)))
                log("step time %.1f ms over the first %d steps: a budget of %d steps (%s; %d per epoch, %.1f epochs), "
                    "decay from step %d unless the valid loss stalls first" %
                    (1000 * dt, step, sched.total, "time" if by_time < by_epochs else "epochs", spe, sched.total / spe,
                     sched.decay_start))
            if step % args.log_every == 0 or step == sched.total:
                el = time.time() - t0
                log("%sstep %d/%s loss %.4f lr %.2e gnorm %.2f %.0f tok/s elapsed %.0fs" %
                    (tag, step, sched.total or "?", run_loss / run_n, lr, float(gn), tokens / el, el))
                run_loss, run_n = 0.0, 0
            if valid_wins is not None and (step % args.eval_every == 0 or step == sched.total):
                v = evaluate(model, valid_wins, device, autocast=torch.bfloat16 if amp else None)
                vl = v[0] / v[1]
                if history is not None:
                    history["valid"].append((start_step + step, vl))
                loads = [m.last_load for m in model.moe_layers() if m.last_load is not None]
                imb = max(float(l.max() / l.mean()) for l in loads) if loads else 0
                log("%svalid loss %.4f ppl %.3f (step %d, epoch %.2f); max expert load / mean %.2f" %
                    (tag, vl, math.exp(vl), step, step / spe, imb))
                if vl < best[0]:
                    best = (vl, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, step)
                    since_best = 0
                else:
                    since_best += 1
                if (patience and since_best >= patience and step >= 2 * spe and sched.decay_start is not None
                        and step < sched.decay_start and sched.start_decay(step, spe)):
                    log("valid loss not improved for %d evaluations: decay from step %d to step %d" %
                        (since_best, sched.decay_start, sched.total))
    return step, best, spe, tokens, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="prepare_data.sh's output directory")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0,
                    help="training steps (0: from --epochs and --time-budget; with --decay-start, the run repeats)")
    ap.add_argument("--epochs", type=float, default=60, help="at most this many passes over the training text")
    ap.add_argument("--time-budget", type=float, default=300, help="seconds of training (without --steps)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--decay-frac", type=float, default=0.2, help="share of the steps in the final LR decay")
    ap.add_argument("--decay-start", type=int, default=0, help="step the decay starts at (0: automatic)")
    ap.add_argument("--patience", type=int, default=6,
                    help="valid evaluations without improvement that start the decay early (0: never)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--chat-frac", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="router selection-bias step per training step")
    ap.add_argument("--qat-steps", type=int, default=300)
    ap.add_argument("--qat-lr", type=float, default=2e-4)
    ap.add_argument("--eval-window", type=int, default=512)
    ap.add_argument("--eval-every", type=int, default=0, help="steps between valid evaluations (0: 4 per epoch)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--samples", type=int, default=48, help="greedy tokens per sample prompt")
    ap.add_argument("--eval-tokens", type=int, default=0,
                    help="evaluate on the first N tokens of valid / heldout only (0: all; for quick checks)")
    args = ap.parse_args()
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    log("k3 fortune model: torch %s on %s%s; args %s" % (
        torch.__version__, device, " (%s)" % torch.cuda.get_device_name(0) if device.type == "cuda" else "",
        json.dumps(vars(args))))

    tok = tokenizer.Tok(args.tokenizer)
    read = lambda n: open(os.path.join(args.data, n), encoding="utf-8").read()
    data = Data(tok, read("train.txt"), args.chat_frac, args.seed)
    cut = lambda ids: ids[: args.eval_tokens] if args.eval_tokens else ids
    valid_wins = eval_windows(cut(tok.encode(read("valid.txt"))), args.eval_window)
    held_ids = cut(tok.encode(read("heldout.txt")))
    held_wins = eval_windows(held_ids, args.eval_window)
    log("data: %d train documents (%d tokens as plain text), valid %d tokens, heldout %d tokens; vocab %d" %
        (len(data.docs), data.tokens_plain, sum(map(len, valid_wins)), len(held_ids), tok.vocab_size))

    c = K3Config(vocab_size=tok.vocab_size, bos_token_id=tok.bos, eos_token_id=tok.end_of_msg, pad_token_id=tok.pad)
    model = K3(c, dropout=args.dropout)
    model.init_weights(args.seed)
    model.to(device)
    counts = count_params(model)
    fpt = flops_per_token(c, args.seq)
    log("config %s" % json.dumps(c.to_dict()))
    log("parameters %s; forward %.1f MFLOP per token (training ~3x)" % (json.dumps(counts), fpt / 1e6))

    steps_per_epoch_est = (data.tokens_plain // (args.seq + 1)) // args.batch
    if not args.eval_every:
        args.eval_every = max(10, steps_per_epoch_est // 4)
    history = {"train": [], "valid": [], "qat_train": [], "qat_valid": []}
    deadline = time.time() + args.time_budget
    sched = Schedule(args.lr, args.warmup, args.min_lr_frac, args.decay_frac, total=args.steps or None,
                     decay_start=args.decay_start or None)
    steps, best, spe, tokens, t_train = train_loop(model, data, args, device, log, sched, history=history,
                                                   valid_wins=valid_wins, deadline=deadline, patience=args.patience)
    log("trained %d steps (%.2f epochs, %d tokens) in %.0f s, decay from step %d; best valid loss %.4f at step %d; "
        "repeat with --steps %d --decay-start %d" % (steps, steps / spe, tokens, t_train, sched.decay_start, best[0],
                                                     best[2], steps, sched.decay_start))
    model.load_state_dict(best[1])
    model.dropout = 0.0

    res = {}
    res["fp32"] = {"valid": ppl(evaluate(model, valid_wins, device)), "heldout": ppl(evaluate(model, held_wins, device))}
    log("fp32 weights: valid ppl %.3f heldout ppl %.3f" % (res["fp32"]["valid"], res["fp32"]["heldout"]))
    for m in model.moe_layers():
        m.experts.quant = mxfp4.fake_quant
    res["ptq"] = {"valid": ppl(evaluate(model, valid_wins, device)), "heldout": ppl(evaluate(model, held_wins, device))}
    log("MXFP4 experts, post-training quantization: valid ppl %.3f heldout ppl %.3f (%+.2f%% heldout vs fp32)" %
        (res["ptq"]["valid"], res["ptq"]["heldout"], 100 * (res["ptq"]["heldout"] / res["fp32"]["heldout"] - 1)))
    chosen = "ptq"
    ptq_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if args.qat_steps > 0:
        qm = model
        qm.dropout = args.dropout
        qh = {"train": history["qat_train"], "valid": history["qat_valid"]}
        qsched = Schedule(args.qat_lr, 0, args.min_lr_frac, 1.0, total=args.qat_steps, decay_start=0)
        qsteps, qbest, _, _, t_qat = train_loop(qm, data, args, device, log, qsched, start_step=steps, quant=True,
                                                history=qh, valid_wins=valid_wins)
        qm.load_state_dict(qbest[1])
        qm.dropout = 0.0
        res["qat"] = {"valid": ppl(evaluate(qm, valid_wins, device)), "heldout": ppl(evaluate(qm, held_wins, device)),
                      "steps": qsteps, "seconds": t_qat}
        log("MXFP4 experts after %d steps of quantization-aware fine-tuning (%.0f s): valid ppl %.3f heldout ppl %.3f "
            "(%+.2f%% heldout vs fp32)" % (qsteps, t_qat, res["qat"]["valid"], res["qat"]["heldout"],
                                          100 * (res["qat"]["heldout"] / res["fp32"]["heldout"] - 1)))
        if res["qat"]["valid"] < res["ptq"]["valid"]:
            chosen = "qat"
        else:
            model.load_state_dict(ptq_state)
    for m in model.moe_layers():
        m.experts.quant = None
    log("exporting the %s model" % chosen)

    mdir = os.path.join(args.out, "model")
    model.cpu()
    export.export(model, mdir, args.tokenizer)
    ck = K3(c)
    export.load_exported(ck, mdir)
    ck.to(device)
    held_exp = evaluate(ck, held_wins, device)
    res["exported"] = {"valid": ppl(evaluate(ck, valid_wins, device)), "heldout": ppl(held_exp)}
    log("exported checkpoint (bf16 weights, MXFP4 experts), float32 compute: valid ppl %.3f heldout ppl %.3f "
        "(%d predicted tokens, NLL %.3f)" % (res["exported"]["valid"], res["exported"]["heldout"], held_exp[1],
                                              held_exp[0]))
    files = sorted(os.listdir(mdir))
    sizes = {f: os.path.getsize(os.path.join(mdir, f)) for f in files}
    ck_bytes = sum(v for f, v in sizes.items() if f.endswith(".safetensors"))
    log("checkpoint %s: %d bytes of shards (%.2f MiB), %d bytes with config, index and tokenizer" %
        (mdir, ck_bytes, ck_bytes / 2 ** 20, sum(sizes.values())))

    samples = []
    prompts = [("plain", "The meaning of life is"), ("plain", "Q: Why did the programmer"), ("plain", "人生"),
               ("chat", "Tell me a fortune."), ("chat", "给我讲一句名言。")]
    for kind, p in prompts:
        if kind == "plain":
            ids = tok.encode(p)
        else:
            ids = chat.encode(tok, chat.segments([{"role": "user", "content": p}], add_generation_prompt=True))
        out = greedy(ck, ids, args.samples, device, stop=(tok.end_of_msg,))
        samples.append({"kind": kind, "prompt": p, "prompt_ids": ids, "greedy_ids": out, "text": tok.decode(out)})
        log("greedy %s %r -> %r" % (kind, p, tok.decode(out)))

    metrics = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "args": vars(args),
        "config": c.to_dict(),
        "parameters": counts,
        "forward_flops_per_token": fpt,
        "checkpoint_bytes": ck_bytes,
        "files": sizes,
        "steps": steps,
        "steps_per_epoch": spe,
        "epochs": steps / spe,
        "train_tokens": tokens,
        "train_seconds": t_train,
        "decay_start": sched.decay_start,
        "best_valid_step": best[2],
        "perplexity": res,
        "exported_quantization": chosen,
        "heldout_exported_nll": {"sum": held_exp[0], "tokens": held_exp[1]},
        "perplexity_protocol": {
            "text": "tools/train_k3/data/heldout.txt (= DIR/heldout.txt)",
            "encode": "tiktoken encode_ordinary with tiktoken.model and the Kimi pat_str; no specials, no BOS",
            "window": args.eval_window,
            "rule": "consecutive non-overlapping windows of `window` tokens (the last one shorter), each from an "
                    "empty state; every token but the first of its window is predicted; ppl = exp(sum NLL / count)",
            "heldout_tokens": len(held_ids),
        },
        "samples": samples,
        "total_seconds": time.time() - t_start,
        "history": history,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1, ensure_ascii=False)
    plot(history, os.path.join(args.out, "loss.png"), log)
    log("done in %.0f s" % (time.time() - t_start))


def plot(history, path, log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no loss plot")
        return
    fig, ax = plt.subplots(figsize=(8, 5))

    def smooth(pts, k=20):
        out, acc = [], []
        for s, v in pts:
            acc.append(v)
            if len(acc) > k:
                acc.pop(0)
            out.append((s, sum(acc) / len(acc)))
        return out

    for key, label, style in (("train", "train (smoothed)", "-"), ("valid", "valid", "o-"),
                              ("qat_train", "QAT train (smoothed)", "-"), ("qat_valid", "QAT valid", "o-")):
        pts = smooth(history[key]) if "train" in key else history[key]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title("K3-architecture fortune model")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log("loss plot: %s" % path)


if __name__ == "__main__":
    main()
