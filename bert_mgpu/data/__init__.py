"""Text to tf.data: tokenization, vocabularies, users' files and tasks, GLUE's layouts, pretraining records
and input."""
