"""Rule base_model: build the tiny model or load a real one, run the optional SFT warm-up, save it."""

from pathlib import Path

from behaviortrace import device, models
from behaviortrace.io import replace_dir, setup_logging

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
device.set_threads(sm.threads)
dev = device.resolve(sm.params.compute)
cfg = {"model": sm.params.model, "task": sm.params.task, "planting": sm.params.planting}
log.info("base model %r on %s", cfg["model"]["name"], dev["device"])
model, tokenizer = models.build_base_model(cfg, dev)
out = Path(sm.output[0])
tmp = out.with_name(out.name + ".tmp")
models.save(model, tokenizer, tmp)
replace_dir(tmp, out)
log.info("saved %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))
