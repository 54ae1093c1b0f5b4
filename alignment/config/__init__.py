"""Every key of grpo_argument.json: the frozen dataclass GRPOConfig (schema.py), made of one dataclass per section of
keys (sections/), filled from the JSON file (files.py) and then from `--key value` pairs on the command line (cli.py),
validated once before any model is loaded (validation.py, preflight.py); --help is help.py's.

Key names are PaddleNLP's; the names TRL and ms-swift users bring are accepted as aliases (aliases.py).
PaddleNLP's keys this trainer spells otherwise or does not have are read as paddlenlp_keys.py says.
An unknown key is an error naming the closest known key; values that disagree fail with a message
naming the keys, every problem of a config in one message. The file's values must have their key's JSON type
("4" is not an integer; a boolean is true, false, 0 or 1, as PaddleNLP's files write them); the command
line is parsed by paddleformers' PdArgumentParser (argparse over dataclass fields), so `--key value` works
exactly as in PaddleNLP's launchers (a list key takes the values up to the next --key). Every number must be
finite and fit in int64.
"""
