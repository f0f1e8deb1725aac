"""Paper model of data-parallel BERT training on 1-8 GPUs: compute vs gradient all-reduce per step.

Prints the table in docs/gpu_scaling.md. Assumptions (stated, not measured here: this machine has no GPU):
  - sustained math rate with mixed precision: V100 ~ 55 TFLOP/s, A100 ~ 140 TFLOP/s (about 45% of the
    tensor-core peak, typical of BERT training step time);
  - NCCL ring all-reduce bus bandwidth ("busbw" of nccl-tests) per link class; time = 2 (N-1)/N * bytes / busbw
    plus 10 us per ring step of latency;
  - gradient bytes as the Trainer sends them: under mixed_float16 the encoder's dense weights in float16,
    embeddings and LayerNorms in float32 (training.allreduce_dtypes);
  - no overlap ("serial") vs every pack but the last hidden behind the backward pass ("overlapped":
    max(compute, comm of the other packs) + comm of the last pack). Packs go last layer first
    (distribute.gradient_packs), so the last pack holds the embeddings, whose gradients backprop makes last:
    in float32 the word-embedding table alone is 94 MB (base) or 125 MB (large).
"""

SHAPES = {"BERT-base": (12, 768, 3072), "BERT-large": (24, 1024, 4096)}
GPUS = {"V100": 55e12, "A100": 140e12}
LINKS = {"NVLink (DGX-1 V100)": ("V100", 130e9), "NVLink (DGX A100)": ("A100", 230e9),
         "PCIe 3.0 x16": ("V100", 10e9), "PCIe 4.0 x16": ("A100", 20e9)}
VOCAB, POSITIONS, SEQ = 30522, 512, 128


def params(layers, hidden, inter):
    embeddings = (VOCAB + POSITIONS + 2) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden * inter + inter + hidden + 4 * hidden
    return embeddings + layers * layer + hidden * hidden + hidden


def embedding_params(hidden):
    return (VOCAB + POSITIONS + 2) * hidden + 2 * hidden  # word, position, segment tables and their LayerNorm


def gradient_bytes(layers, hidden, inter, float16=True):
    """(all gradient bytes, bytes of the last pack: the embeddings) as the Trainer all-reduces them."""
    total, embeddings = params(layers, hidden, inter), embedding_params(hidden)
    if not float16:
        return 4 * total, 4 * embeddings
    layer_norms = layers * 4 * hidden  # two LayerNorms a layer, gamma and beta
    return 4 * (embeddings + layer_norms) + 2 * (total - embeddings - layer_norms), 4 * embeddings


def train_flops_per_sequence(layers, hidden, inter, seq=SEQ):
    per_layer = 2 * seq * (4 * hidden * hidden + 2 * hidden * inter) + 4 * seq * seq * hidden
    return 3 * layers * per_layer


def allreduce_seconds(nbytes, n, busbw):
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / busbw + 2 * (n - 1) * 10e-6


def rows(batch_per_gpu=32, float16=True, accum=1):
    out = []
    for model, shape in SHAPES.items():
        nbytes, last = gradient_bytes(*shape, float16=float16)
        compute = accum * batch_per_gpu * train_flops_per_sequence(*shape)
        for link, (gpu, busbw) in LINKS.items():
            t = compute / GPUS[gpu]
            for n in (1, 2, 4, 8):
                comm = allreduce_seconds(nbytes, n, busbw)
                exposed = allreduce_seconds(last, n, busbw)
                serial = t / (t + comm)
                overlapped = t / (max(t, comm - exposed) + exposed) if n > 1 else 1.0
                out.append((model, link, n, nbytes / 1e6, t * 1e3, comm * 1e3, serial, overlapped))
    return out


# Two machines of 8 GPUs: one NCCL ring over all 16 (MultiWorkerMirroredStrategy with NCCL), whose
# bus bandwidth is the slower of NVLink inside a machine and the network between them (per machine,
# as nccl-tests reports it across nodes); 20 us per ring step that crosses the network.
NETWORKS = {"25 GbE": 2.5e9, "100 GbE": 10e9, "InfiniBand HDR x1 (200 Gb/s)": 22e9,
            "InfiniBand HDR x8 (DGX A100)": 180e9}


def two_machine_rows(batch_per_gpu=32, accum=1, gpus=8):
    out = []
    for model, shape in SHAPES.items():
        nbytes, last = gradient_bytes(*shape)
        gpu, nvlink = LINKS["NVLink (DGX A100)"]
        t = accum * batch_per_gpu * train_flops_per_sequence(*shape) / GPUS[gpu]
        for network, bw in NETWORKS.items():
            n, busbw = 2 * gpus, min(nvlink, bw)
            comm = 2 * (n - 1) / n * nbytes / busbw + 2 * (n - 1) * 20e-6
            exposed = 2 * (n - 1) / n * last / busbw + 2 * (n - 1) * 20e-6
            out.append((model, network, accum, t * 1e3, comm * 1e3, t / (t + comm),
                        t / (max(t, comm - exposed) + exposed)))
    return out


def two_machine_table():
    lines = ["| model | network | micro-batches per all-reduce | compute ms | all-reduce ms | efficiency serial |"
             " efficiency overlapped |", "|---|---|---:|---:|---:|---:|---:|"]
    for accum in (1, 8):
        for model, net, a, t, c, s, o in two_machine_rows(accum=accum):
            lines.append(f"| {model} | {net} | {a} | {t:.1f} | {c:.1f} | {100 * s:.0f}% | {100 * o:.0f}% |")
    return "\n".join(lines)


def table(**kw):
    lines = ["| model | interconnect | GPUs | gradient MB | compute ms | all-reduce ms | efficiency serial |"
             " efficiency overlapped |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for model, link, n, mb, t, c, s, o in rows(**kw):
        lines.append(f"| {model} | {link} | {n} | {mb:.0f} | {t:.1f} | {c:.1f} | {100 * s:.0f}% | {100 * o:.0f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("Per GPU batch 32 at seq 128, mixed_float16 (float16 gradients, embeddings and LayerNorms float32):\n")
    print(table())
    print("\nSame, float32 gradients (float32 or mixed_bfloat16 training):\n")
    print(table(float16=False))
    print("\n8 micro-batches accumulated per all-reduce (global batch 256 per GPU), mixed_float16:\n")
    print(table(accum=8))
    print("\n2 machines x 8 A100 (NVLink inside), batch 32 per GPU, mixed_float16, by the network between them:\n")
    print(two_machine_table())
