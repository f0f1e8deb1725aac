"""The notebook classes: BertClassifier, BertPretrainer, Encoder, and the GLUE suite."""
