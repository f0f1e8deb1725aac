"""bert_mgpu: fine-tune and run google-research/bert checkpoints on every GPU (or CPU core) of a machine.

    import bert_mgpu
    towers = bert_mgpu.Towers(n_gpus=0, towers_per_gpu=2, train_batch_size=16)
    clf = bert_mgpu.BertClassifier.from_pretrained("uncased_L-12_H-768_A-12/bert_model.ckpt",
                                                   labels=["0", "1"], towers=towers)
"""

from bert_mgpu.classifier import BertClassifier
from bert_mgpu.config import BertConfig
from bert_mgpu.devices import DevicePlan, Towers, plan_devices
from bert_mgpu.distribute import make_strategy
from bert_mgpu.errors import UserError
from bert_mgpu.pretraining import BertPretrainer, Budget, Validation
from bert_mgpu.pretraining_input import PretrainingData
from bert_mgpu.tasks import Example, get_task
from bert_mgpu.tokenization import FullTokenizer

__all__ = ["BertClassifier", "BertConfig", "BertPretrainer", "Budget", "DevicePlan", "Example", "FullTokenizer",
           "PretrainingData", "Towers", "UserError", "Validation", "get_task", "make_strategy", "plan_devices"]
__version__ = "0.1.0"
