"""Finding, downloading and verifying the checkpoint as the Hugging Face hub publishes it:
``releases`` (repo ids, the cache layout, sizes, :class:`~v4flash.hub.releases.HubError`),
``locate`` (``--model``), ``hashes`` (verification), ``fetch`` (``v4flash download``).

``--model`` takes a folder or a repo id (``deepseek-ai/DeepSeek-V4-Flash``); a repo id is looked
up in the local Hugging Face cache only (``try_to_load_from_cache``: no network, ever). When it
is not there the error says how to get it and how much disk that takes.

Verification needs no network either: the hub publishes the sha256 of every LFS file, and both
places ``huggingface_hub`` downloads to keep it:

- the cache (``models--ORG--NAME/snapshots/COMMIT/FILE`` is a link to ``blobs/ETAG``): the blob's
  file name is its etag, the sha256 of the content for LFS files (64 hex digits) and the git
  blob id, ``sha1("blob SIZE\\0" + content)``, for small files (40 hex digits);
- a ``--dir``/``local_dir`` download: ``.cache/huggingface/download/FILE.metadata`` holds the
  commit on its first line and the same etag on its second.

``huggingface_hub`` is optional (``pip install 'v4flash[hub]'``); only the repo-id lookup and
``download`` need it, verification reads the documented layouts itself.
"""
