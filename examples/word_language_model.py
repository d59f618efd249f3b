"""The pytorch/examples word-level language model (``word_language_model``: ``model.py`` and
``main.py``): an RNN (LSTM, GRU, RNN_TANH, RNN_RELU) or a Transformer encoder (a subclass of
``nn.Transformer`` with sinusoidal positional encoding) over token batches of ``bptt`` steps,
trained with plain SGD written by hand (``p.data.add_(p.grad, alpha=-lr)``), gradient clipping,
truncated backpropagation through time (``repackage_hidden``) and learning-rate annealing.

The corpus is synthetic (a random Markov chain over the vocabulary, drawn with numpy) instead of
Wikitext-2. Written as PyTorch code and ported by renaming ``torch`` to ``lucid``: this file with
every ``lucid`` renamed ``torch`` is the PyTorch original.

    python examples/word_language_model.py --model LSTM --epochs 2
    python examples/word_language_model.py --model Transformer --epochs 2
"""

import argparse
import math
import os
import time

import numpy as np

import lucid
import lucid.nn as nn
import lucid.nn.functional as F
import lucid.onnx

# --- model.py ---------------------------------------------------------------------------------


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ["LSTM", "GRU"]:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            try:
                nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}[rnn_type]
            except KeyError as e:
                raise ValueError(
                    "An invalid option for `--model` was supplied, "
                    "options are ['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']"
                ) from e
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

        # "Using the Output Embedding to Improve Language Models" (Press & Wolf 2016)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (
                weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid),
            )
        else:
            return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    """Sinusoidal positional encoding ("Attention Is All You Need"):
    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""

    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)

        pe = lucid.zeros(max_len, d_model)
        position = lucid.arange(0, max_len, dtype=lucid.float).unsqueeze(1)
        div_term = lucid.exp(lucid.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = lucid.sin(position * div_term)
        pe[:, 1::2] = lucid.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[: x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Transformer):
    """Container module with an encoder, a recurrent or transformer module, and a decoder."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__(
            d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers
        )
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)

        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        return lucid.log(lucid.tril(lucid.ones(sz, sz)))

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None

        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


# --- data: a synthetic corpus instead of data.Corpus -------------------------------------------


def synthetic_corpus(ntokens, length, seed):
    """A token stream from a random sparse Markov chain (each token has four likely successors),
    as an int64 tensor: learnable structure for the model, drawn with numpy."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, ntokens, size=(ntokens, 4))
    stream = np.empty(length, dtype=np.int64)
    stream[0] = 0
    choices = rng.integers(0, 4, size=length)
    noise = rng.random(length) < 0.1
    random_tokens = rng.integers(0, ntokens, size=length)
    for i in range(1, length):
        stream[i] = random_tokens[i] if noise[i] else successors[stream[i - 1], choices[i]]
    return lucid.from_numpy(stream)


# --- main.py -----------------------------------------------------------------------------------


def batchify(data, bsz, device):
    # Work out how cleanly we can divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    # Trim off any extra elements that wouldn't cleanly fit (remainders).
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, lucid.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i : i + seq_len]
    target = source[i + 1 : i + 1 + seq_len].view(-1)
    return data, target


def evaluate(args, model, criterion, data_source, ntokens):
    # Turn on evaluation mode which disables dropout.
    model.eval()
    total_loss = 0.0
    if args.model != "Transformer":
        hidden = model.init_hidden(args.eval_batch_size)
    with lucid.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i, args.bptt)
            if args.model == "Transformer":
                output = model(data)
                output = output.view(-1, ntokens)
            else:
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train(args, model, criterion, train_data, ntokens, lr, epoch):
    # Turn on training mode which enables dropout.
    model.train()
    total_loss = 0.0
    losses = []
    start_time = time.time()
    if args.model != "Transformer":
        hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i, args.bptt)
        # Starting each batch, we detach the hidden state from how it was previously produced.
        # If we didn't, the model would try backpropagating all the way to start of the dataset.
        model.zero_grad()
        if args.model == "Transformer":
            output = model(data)
            output = output.view(-1, ntokens)
        else:
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()

        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
        lucid.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)

        total_loss += loss.item()
        losses.append(loss.item())

        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            if not args.quiet:
                n_batches = len(train_data) // args.bptt
                ms_per_batch = elapsed * 1000 / args.log_interval
                print(
                    f"| epoch {epoch:3d} | {batch:5d}/{n_batches:5d} batches | lr {lr:02.2f} | "
                    f"ms/batch {ms_per_batch:5.2f} | loss {cur_loss:5.2f} | "
                    f"ppl {math.exp(cur_loss):8.2f}"
                )
            total_loss = 0
            start_time = time.time()
        if args.dry_run:
            break
    return losses


def export_onnx(model, path, batch_size, seq_len, device):
    print(f"The model is also exported in ONNX format at {os.path.realpath(path)}.")
    model.eval()
    dummy_input = lucid.LongTensor(seq_len * batch_size).zero_().view(-1, batch_size).to(device)
    hidden = model.init_hidden(batch_size)
    lucid.onnx.export(model, (dummy_input, hidden), path)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="PyTorch-style RNN/Transformer Language Model")
    parser.add_argument(
        "--model",
        type=str,
        default="LSTM",
        help="type of network (RNN_TANH, RNN_RELU, LSTM, GRU, Transformer)",
    )
    parser.add_argument("--ntokens", type=int, default=50, help="vocabulary size")
    parser.add_argument("--corpus-length", type=int, default=6000)
    parser.add_argument("--emsize", type=int, default=32, help="size of word embeddings")
    parser.add_argument("--nhid", type=int, default=32, help="hidden units per layer")
    parser.add_argument("--nlayers", type=int, default=2, help="number of layers")
    parser.add_argument("--lr", type=float, default=20, help="initial learning rate")
    parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
    parser.add_argument("--epochs", type=int, default=2, help="upper epoch limit")
    parser.add_argument("--batch-size", type=int, default=10, metavar="N")
    parser.add_argument("--eval-batch-size", type=int, default=10)
    parser.add_argument("--bptt", type=int, default=10, help="sequence length")
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--tied", action="store_true", help="tie the word embedding and softmax")
    parser.add_argument("--seed", type=int, default=1111, help="random seed")
    parser.add_argument("--log-interval", type=int, default=50, metavar="N")
    parser.add_argument("--save", type=str, default="", help="path to save the final model")
    parser.add_argument(
        "--onnx-export", type=str, default="", help="path to export the final model in onnx format"
    )
    parser.add_argument("--nhead", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="verify the code and the model")
    parser.add_argument("--compile", action="store_true", help="compile the model")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)  # fmt: skip


def build_model(args, ntokens):
    if args.model == "Transformer":
        return TransformerModel(
            ntokens, args.emsize, args.nhead, args.nhid, args.nlayers, args.dropout
        )
    return RNNModel(
        args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied
    )


def main(argv=None, model=None):
    """Train and evaluate; returns the model and the history (per epoch: the training losses
    and the validation loss), then the test loss. ``model`` replaces the freshly built one."""
    args = parse_args(argv)
    # Set the random seed manually for reproducibility.
    lucid.manual_seed(args.seed)
    device = lucid.device("cuda" if lucid.cuda.is_available() else "cpu")

    ntokens = args.ntokens
    corpus = synthetic_corpus(ntokens, args.corpus_length, args.seed)
    n_train, n_valid = int(0.8 * len(corpus)), int(0.1 * len(corpus))
    train_data = batchify(corpus[:n_train], args.batch_size, device)
    val_data = batchify(corpus[n_train : n_train + n_valid], args.eval_batch_size, device)
    test_data = batchify(corpus[n_train + n_valid :], args.eval_batch_size, device)

    if model is None:
        model = build_model(args, ntokens)
    model = model.to(device)
    criterion = nn.NLLLoss()
    forward = lucid.compile(model) if args.compile else model

    lr = args.lr
    best_val_loss = None
    history = []
    for epoch in range(1, args.epochs + 1):
        epoch_start_time = time.time()
        losses = train(args, forward, criterion, train_data, ntokens, lr, epoch)
        val_loss = evaluate(args, forward, criterion, val_data, ntokens)
        history.append((losses, val_loss))
        if not args.quiet:
            print("-" * 89)
            seconds = time.time() - epoch_start_time
            print(
                f"| end of epoch {epoch:3d} | time: {seconds:5.2f}s | valid loss {val_loss:5.2f} | "
                f"valid ppl {math.exp(val_loss):8.2f}"
            )
            print("-" * 89)
        # Save the model if the validation loss is the best we've seen so far.
        if not best_val_loss or val_loss < best_val_loss:
            if args.save:
                with open(args.save, "wb") as f:
                    lucid.save(model.state_dict(), f)
            best_val_loss = val_loss
        else:
            # Anneal the learning rate if no improvement has been seen in the validation dataset.
            lr /= 4.0

    test_loss = evaluate(args, forward, criterion, test_data, ntokens)
    if not args.quiet:
        print("=" * 89)
        print(
            f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}"
        )
        print("=" * 89)

    if len(args.onnx_export) > 0:
        # Export the model in ONNX format.
        export_onnx(model, args.onnx_export, batch_size=1, seq_len=args.bptt, device=device)
    return model, history, test_loss


if __name__ == "__main__":
    main()
