"""The distributed training engine (DESIGN.md §6).

``trainer.train`` is what ``LibreYOLO.train`` calls; ``launcher`` spawns one worker per device;
``distributed`` sets up the process group; ``sync_batchnorm``, ``autobatch``, ``optim``, ``ema``,
``seeding``, ``callbacks`` and ``plotting`` are the pieces of the loop. docs/multi-gpu.md is the
user's guide.
"""

__all__: list[str] = []
