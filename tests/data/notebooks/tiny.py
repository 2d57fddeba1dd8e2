# %% [markdown]
# # Tiny notebook for the batch-runner tests
# Multiplies two numbers; a product above `limit` is an impossible scenario (a user error).

# %% tags=["parameters"]
x: float = 1.0  # a factor
limit: float = 50.0  # products above this are infeasible
y: int = 2  # an integer factor
label: str = "tiny"  # carried into the headline unchanged
figure: bool = False  # also save a small chart through model.frontends.charts
output_dir: str = "."  # where headline.json (and the figure) go

# %%
# ruff: noqa: E402, B018  (notebook: imports after the parameters cell, cells end in a display)
from pathlib import Path

from model.frontends.nbio import write_headline
from model.specs.errors import Infeasible

product = x * y
if product > limit:
    raise Infeasible(f"x*y = {product:g} exceeds limit {limit:g}")

# %%
if figure:
    import pandas as pd

    from model.frontends import charts

    df = pd.DataFrame({"y": list(range(y + 1)), "product": [x * k for k in range(y + 1)]})
    charts.save(charts.line_chart(df, "y", "product", title=label), Path(output_dir) / "line")

# %%
write_headline(output_dir, {"product": product, "label": label, "detail": {"x": x, "y": y}})
