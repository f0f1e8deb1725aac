"""bert_mgpu: google-research/bert fine-tuning and pretraining on every GPU of a machine (TF2 + Keras 3)."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
# The scripts: every top-level .py file with a `_console()` (bert_mgpu/cli/flags_reference.py finds them alike).
SCRIPTS = sorted(f[:-3] for f in os.listdir(HERE) if f.endswith(".py") and f != "setup.py"
                 and "\ndef _console(" in open(os.path.join(HERE, f), encoding="utf-8").read())

setup(
    name="bert_mgpu",
    version="0.1.0",
    description="Multi-tower (in-graph replicated) BERT training with tf.distribute and keras-hub",
    packages=find_packages(include=["bert_mgpu", "bert_mgpu.*"]),
    py_modules=SCRIPTS,
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "tensorboard>=2.21,<2.22",
        "keras>=3.15,<3.16",  # the Keras optimizer internals training relies on are tested against 3.15
        "keras-hub>=0.32,<0.33",
        "keras-nlp>=0.32,<0.33",
        "tensorflow-datasets>=4.9",
        "numpy>=1.26",
        "absl-py>=2.1",
        "safetensors>=0.4",
    ],
    extras_require={
        # GPUs: TensorFlow finds CUDA, cuDNN, NCCL and XLA's ptxas/libdevice only through these wheels;
        # nvidia-ml-py (pynvml) reads each GPU's utilisation, memory, temperature and power while training.
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22", "nvidia-ml-py>=12"],
        # pandas: evaluate/predict take a DataFrame (read by duck typing; the library never imports pandas).
        # scikit-learn and seqeval: the references the metrics (written in NumPy and Python) are tested
        # against. seqeval ships only a source archive, built by PEP 517 (make passes --use-pep517).
        "test": ["pytest>=8", "pytest-xdist>=3.8", "ruff>=0.17,<0.18", "pandas>=2", "matplotlib>=3.8",
                 "nbclient>=0.10", "nbformat>=5", "ipykernel>=6", "scikit-learn>=1.4", "seqeval==1.2.2",
                 "nvidia-ml-py>=12",  # its real module, meeting a machine without a driver
                 "wandb>=0.21", "mlflow-skinny>=3",  # report_to's loggers, tested offline
                 "jieba>=0.42",  # the zh extra's segmenter
                 "tf2onnx>=1.17", "onnx>=1.17", "onnxruntime>=1.20", "tokenizers>=0.20",  # the onnx extra
                 "ai-edge-litert>=2.1"],  # the tflite extra
        # transformers (PyTorch) is the reference the parity tests compare against (PEFT: LoRA's); never imported by the
        # library. Never beside `gpu`: PyTorch's CUDA wheels (nvidia-*-cu13) overwrite the NCCL and cuDNN
        # files of TensorFlow's (nvidia-*-cu12), so make installs it only where there is no GPU.
        "reference": ["torch==2.13.0", "transformers>=5,<6", "peft>=0.17"],
        # --report_to=wandb,mlflow (train/reporting.py); TensorBoard needs nothing more.
        "loggers": ["wandb>=0.21", "mlflow-skinny>=3"],
        # --word_segmenter=jieba: Chinese words for whole-word masking (pure Python, its own dictionary).
        "zh": ["jieba>=0.42"],
        # --export_format=onnx/onnx_int8 (io/onnx_export.py): the converter, ONNX Runtime (which checks each export
        # and quantizes int8) and Hugging Face's tokenizers, which read the export's tokenizer.json.
        "onnx": ["tf2onnx>=1.17", "onnx>=1.17", "onnxruntime>=1.20", "tokenizers>=0.20"],
        # --export_format=tflite (io/tflite_export.py): LiteRT's interpreter, which checks each export (the
        # converter is TensorFlow's own).
        "tflite": ["ai-edge-litert>=2.1"],
        # learning_curves.png and confusion_matrix.png (bert_mgpu.io.plot); training never needs it.
        "plot": ["matplotlib>=3.8"],
    },
    entry_points={"console_scripts": [f"{m}={m}:_console" for m in SCRIPTS]},
)
