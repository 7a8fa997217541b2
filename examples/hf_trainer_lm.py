"""A Trainer script in the shape of the Transformers docs' "Fine-tuning" tutorial (docs/source/en/training.md).

The same steps as there: tokenize a text dataset with truncation and split off a test set, a
``DataCollatorForLanguageModeling(tokenizer, mlm=False)``, a causal language model from
``AutoModelForCausalLM``, ``TrainingArguments`` (epochs, per-device batch with gradient
accumulation, learning rate, logging, evaluation and saving every epoch, the best model at the end)
and ``Trainer(...).train()``. So that it runs here, without the hub: the text is the Python standard
library's own source (a few files, cut into 63-character pieces), the tokenizer is ByT5's byte-level
one (no vocabulary file), the model is a two-layer Qwen3 built from its config (not
``from_pretrained``), and the GPU-only and hub steps (``bf16``, ``gradient_checkpointing``,
``login``, ``push_to_hub``) are left out.

    torchrun --nproc-per-node 4 examples/hf_trainer_lm.py
"""

import argparse
import random
import sysconfig
from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    ByT5Tokenizer,
    DataCollatorForLanguageModeling,
    Qwen3Config,
    Trainer,
    TrainingArguments,
)

SOURCES = ("argparse.py", "textwrap.py", "dataclasses.py", "functools.py", "pathlib.py", "string.py", "shutil.py")


def corpus_pieces(max_bytes: int, length: int = 63) -> list[dict[str, str]]:
    """Records with a ``text`` column: consecutive pieces of the standard library files above."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((folder / name).read_text(encoding="utf-8") for name in SOURCES)[:max_bytes]
    return [{"text": text[i:i + length]} for i in range(0, len(text) - length + 1, length)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="runs/qwen3-stdlib")
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--max_bytes", type=int, default=150_000)
    args = parser.parse_args()

    # Tokenization: truncated to max_length tokens, then a test split
    tokenizer = ByT5Tokenizer()
    records = corpus_pieces(args.max_bytes)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=64)

    encoded = tokenize({"text": [r["text"] for r in records]})  # as dataset.map(tokenize, batched=True)
    dataset = [{"input_ids": i, "attention_mask": m} for i, m in zip(encoded["input_ids"], encoded["attention_mask"],
                                                                     strict=True)]
    random.Random(0).shuffle(dataset)
    split = len(dataset) * 9 // 10  # as dataset.train_test_split(test_size=0.1)
    dataset = {"train": dataset[:split], "test": dataset[split:]}

    data_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)

    # Loading a model
    model = AutoModelForCausalLM.from_config(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=384, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id))

    # Training configuration
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.num_train_epochs,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        learning_rate=1e-3,
        logging_steps=10,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        use_cpu=True,  # this machine has no GPU: Accelerate runs the processes on CPUs (gloo)
    )

    # Training
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=dataset["train"],
        eval_dataset=dataset["test"],
        processing_class=tokenizer,
        data_collator=data_collator,
    )
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
