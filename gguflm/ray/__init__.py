"""gguflm on a Ray cluster (the ``ray`` extra: ``pip install "gguflm[ray]"``).

- :mod:`gguflm.ray.serve`: replicas of ``gguflm serve``'s engine behind one OpenAI endpoint
  (``build_openai_app``, autoscaling, several models, session affinity); ``gguflm serve --ray``.
- :mod:`gguflm.ray.data`: processors for :meth:`ray.data.Dataset.map_batches` (generation,
  embeddings, reranking) with one model load per actor.
- :mod:`gguflm.ray.files`: model files by path or fetched once per node.

``import gguflm`` never imports Ray; importing these modules does.
"""

try:
    import ray  # noqa: F401
except ImportError as exc:  # the ray extra is missing
    raise ImportError(f'gguflm.ray needs the ray extra: pip install "gguflm[ray]" ({exc})') from exc
