"""llama.cpp's logits for given token ids, through llama-cpp-python.

Run with the Python that has llama_cpp (not llminfer's):
    $LLMINFER_PEER_PYTHON bench/peer_logits.py MODEL.gguf IDS.npy OUT.npy [--n-ctx 512]
        [--lora ADAPTER.gguf --lora-scale S]

IDS.npy holds int32 token ids; OUT.npy gets float32 logits [n_tokens,
n_vocab], every position's, from one batched evaluation of the ids. Used by
tests/models/test_archs_peer.py and bench/archs_peer.py.
"""

import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("out")
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora", default=None, help="a LoRA adapter GGUF, applied at --lora-scale")
    ap.add_argument("--lora-scale", type=float, default=1.0)
    args = ap.parse_args()

    from llama_cpp import Llama

    ids = np.load(args.ids).astype(np.int64).tolist()
    llm = Llama(model_path=args.model, n_ctx=args.n_ctx, n_batch=max(len(ids), 1), n_ubatch=max(len(ids), 1),
                logits_all=True, n_threads=args.threads, n_threads_batch=args.threads, verbose=False,
                # llama-cpp-python passes 32 and 1 by default, over the file's
                # own rope.scaling.yarn_beta_* (mistral3); -1 lets llama.cpp read them
                yarn_beta_fast=-1.0, yarn_beta_slow=-1.0,
                **({"lora_path": args.lora, "lora_scale": args.lora_scale} if args.lora else {}))
    llm.eval(ids)
    np.save(args.out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))


if __name__ == "__main__":
    main()
