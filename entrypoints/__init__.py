"""posttrain's job side: one module per algorithm and the shared runtime."""

import logging

# bitsandbytes (which PEFT, and so transformers' Trainer, imports) warns on import, on CPUs with AVX-512 BF16, that
# it could not fetch a faster CPU kernel from the Hub: jobs reach no Hub, and every rank of every job would say it
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
