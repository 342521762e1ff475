"""One module per backend; `fastdata.factory` chooses among them."""
