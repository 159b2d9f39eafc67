/* The subcommands of `longtune`, one line each: LT_CMD(name, handler, one-line summary).
 * Each handler lives in cli/cmd_<name>.c, takes argv with argv[0] = the subcommand name, and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
LT_CMD(info, lt_cmd_info, "show the build's features, devices and memory")
LT_CMD(bench, lt_cmd_bench, "run a benchmark and write its JSON result (see bench --help)")
LT_CMD(plan, lt_cmd_plan, "will a run fit? memory per lifetime class, peak, budget, largest length/batch")
LT_CMD(tokenize, lt_cmd_tokenize, "print the token ids of text on stdin (or decode ids) with a model's tokenizer")
LT_CMD(pack, lt_cmd_pack, "tokenise a dataset, pack it into rows of --max-seq-length and print the statistics")
LT_CMD(train, lt_cmd_train, "fine-tune LoRA/QLoRA adapters (mlx-lm lora flags; see train --help)")
LT_CMD(generate, lt_cmd_generate, "answer a prompt with a model and optionally an adapter")
LT_CMD(export, lt_cmd_export, "merge an adapter into its base and write an HF folder, a GGUF or a GGUF LoRA")
LT_CMD(chat, lt_cmd_chat, "talk to a model (and an adapter) over stdin, the history kept through its chat template")
LT_CMD(eval, lt_cmd_eval, "mean loss and perplexity of a model (and an adapter) on a data split, as train evaluates")
