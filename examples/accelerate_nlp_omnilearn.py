"""accelerate_nlp.py with omnilearn's controller: its Accelerator and training loader are omnilearn's.

    torchrun --nproc-per-node 4 examples/accelerate_nlp_omnilearn.py --cpu --policy dynamic

The rest of this docstring is accelerate_nlp.py's: docs/guide/frameworks.md shows the diff.

The same parts as there: ``get_dataloaders`` (sentence pairs, a collate function that pads each
batch), ``training_function`` (an ``Accelerator``, a BERT sequence classifier, AdamW with a linear
warm-up schedule, ``accelerator.prepare``, the loop with ``accelerator.backward``, an evaluation
pass with ``gather_for_metrics`` after each epoch) and ``main`` with its ``config`` dict. So that it
runs here, without the model and dataset hubs: the BERT is built from a small ``BertConfig`` (not
``from_pretrained``), the sentence pairs are generated (the second sentence is on the first one's
topic, label 1, or unrelated, label 0) and already given as token ids, and the metric (accuracy
and F1, as GLUE's for MRPC) is computed here.
"""

import argparse

import torch
from accelerate import Accelerator, DistributedType
from omnilearn.accelerate import HeteroAccelerator
from torch.optim import AdamW
from torch.utils.data import DataLoader, Dataset
from transformers import (
    BatchEncoding,
    BertConfig,
    BertForSequenceClassification,
    get_linear_schedule_with_warmup,
    set_seed,
)

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32
VOCAB, WORDS, TOPICS = 1000, 16, 8  # token ids (0-4: [PAD], [UNK], [CLS], [SEP], [MASK]); words per sentence
CLS, SEP = 2, 3


class SentencePairs(Dataset):
    """``n`` generated sentence pairs as BERT's tokenizer gives them: [CLS] first [SEP] second [SEP].

    The first sentence draws its words from one of ``TOPICS`` topics (ranges of token ids). The
    second is on the same topic (a paraphrase, label 1) or draws its words from the whole
    vocabulary (an unrelated sentence, label 0).
    """

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        size = (VOCAB - 5) // TOPICS
        topic = 5 + size * torch.randint(0, TOPICS, (n, 1), generator=g)
        first = topic + torch.randint(0, size, (n, WORDS), generator=g)
        second = torch.where(self.labels[:, None] == 1, topic + torch.randint(0, size, (n, WORDS), generator=g),
                             torch.randint(5, VOCAB, (n, WORDS), generator=g))
        cls, sep = torch.full((n, 1), CLS), torch.full((n, 1), SEP)
        self.input_ids = torch.cat([cls, first, sep, second, sep], dim=1)
        self.token_type_ids = torch.cat([torch.zeros(n, WORDS + 2, dtype=torch.long),
                                         torch.ones(n, WORDS + 1, dtype=torch.long)], dim=1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.input_ids[i], "token_type_ids": self.token_type_ids[i],
                "attention_mask": torch.ones_like(self.input_ids[i]), "labels": self.labels[i]}


class PairMetric:
    """Accuracy and F1 of the positive class, over the batches added (GLUE's metric for MRPC)."""

    def __init__(self) -> None:
        self.predictions: list[torch.Tensor] = []
        self.references: list[torch.Tensor] = []

    def add_batch(self, predictions: torch.Tensor, references: torch.Tensor) -> None:
        self.predictions.append(predictions.cpu())
        self.references.append(references.cpu())

    def compute(self) -> dict:
        p, r = torch.cat(self.predictions), torch.cat(self.references)
        self.predictions, self.references = [], []
        tp = int(((p == 1) & (r == 1)).sum())
        return {"accuracy": float((p == r).float().mean()), "f1": 2 * tp / max(int((p == 1).sum() + (r == 1).sum()), 1)}


def get_dataloaders(accelerator: Accelerator, batch_size: int = 16):
    """The training and validation loaders (2,048 and 512 pairs)."""
    datasets = {"train": SentencePairs(2048, seed=1), "validation": SentencePairs(512, seed=2)}

    def collate_fn(examples):
        # pad each batch to its longest pair (a multiple of 8 under mixed precision)
        multiple = 8 if accelerator.mixed_precision != "no" else 1
        longest = -(-max(len(e["input_ids"]) for e in examples) // multiple) * multiple
        batch = {k: torch.stack([torch.nn.functional.pad(e[k], (0, longest - len(e[k]))) for e in examples])
                 for k in ("input_ids", "token_type_ids", "attention_mask")}
        batch["labels"] = torch.stack([e["labels"] for e in examples])
        return BatchEncoding(batch)

    train_dataloader = DataLoader(datasets["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size,
                                  drop_last=True)
    eval_dataloader = DataLoader(datasets["validation"], shuffle=False, collate_fn=collate_fn,
                                 batch_size=EVAL_BATCH_SIZE, drop_last=(accelerator.mixed_precision == "fp8"))
    return train_dataloader, eval_dataloader


def training_function(config, args):
    accelerator = HeteroAccelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, policy=args.policy,
                                    per_level_threads=True)
    lr, num_epochs, seed, batch_size = config["lr"], int(config["num_epochs"]), int(config["seed"]), int(config["batch_size"])
    metric = PairMetric()

    # a batch larger than a device takes is reached by accumulating gradients
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = BertForSequenceClassification(BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=512,
                                                     max_position_embeddings=64))
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=100,
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps)

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, accelerator.share_batches(train_dataloader), eval_dataloader, lr_scheduler
    )
    accelerator.start_up(lambda batch: accelerator.backward(model(**batch).loss))

    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device)
            outputs = model(**batch)
            loss = outputs.loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        for batch in eval_dataloader:
            batch.to(accelerator.device)
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            metric.add_batch(predictions=predictions, references=references)
        accelerator.print(f"epoch {epoch}:", metric.compute())
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"],
                        help="Whether to use mixed precision.")
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--policy", default="dynamic")
    args = parser.parse_args()
    config = {"lr": 1e-3, "num_epochs": args.num_epochs, "seed": 42, "batch_size": 16}
    training_function(config, args)


if __name__ == "__main__":
    main()
