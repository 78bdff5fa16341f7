"""Pictures and charts people look at after a run: drawn batches, confusion matrices, curves, results.png.

- ``drawing``: class colours, captions, boxes, masks, batch grids, image files;
- ``figures``: matplotlib figures on the Agg canvas (never ``pyplot``: a caller's backend is left alone);
- ``validation_report``: the ``ValidationReport`` a task fills in during validation;
- ``confusion``, ``detection_curves``, ``dataset_labels``: the task charts;
- ``results_plot``: ``results.png`` from ``results.csv``.

Submodules are imported by their full names, so that drawing a prediction does not import the charts.
"""

__all__: list[str] = []
