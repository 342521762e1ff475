"""One module per backend (`torch`: the drop-in, with `torch_iter`, how its passes iterate; `pil`, `wds`,
`dali`, `ray`: image mode); `fastdata.factory` chooses among them."""
