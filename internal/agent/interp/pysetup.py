# Run silently in every new python kernel by the code interpreter (see
# snippets.go). Everything lives in one function so the user's namespace
# gets no names. Nothing heavy is imported here: pandas, matplotlib and PIL
# are only touched once user code has imported them, so an idle kernel stays
# small.
def __cubicle_setup():
    import json
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from traitlets import ObjectName, Unicode

    shell = get_ipython()
    if shell is None:
        return
    formatters = shell.display_formatter.formatters

    def finite(v):
        # NaN and infinities are not JSON; the SDKs could not parse them.
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        return v

    class DataFrameData(BaseFormatter):
        """e2b/data: a pandas DataFrame as {column: [values]}."""

        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            columns = {}
            for name, values in obj.to_dict(orient="list").items():
                columns[str(name)] = [
                    v.isoformat() if isinstance(v, pandas.Timestamp) else finite(v)
                    for v in values
                ]
            return columns

    class FigureChart(BaseFormatter):
        """e2b/chart: a matplotlib Figure described by e2b_charts."""

        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj):
            figure_mod = sys.modules.get("matplotlib.figure")
            if figure_mod is None or not isinstance(obj, figure_mod.Figure):
                return super().__call__(obj)
            try:
                from e2b_charts import chart_figure_to_dict
            except ImportError:
                return None
            try:
                return chart_figure_to_dict(obj)
            except Exception:
                return {}

    class PlainJSON(JSONFormatter):
        """application/json for plain lists and dicts, as e2b shows them."""

        def __call__(self, obj):
            if isinstance(obj, (list, dict)):
                try:
                    return json.loads(json.dumps(obj, allow_nan=False)), {"expanded": True}
                except (TypeError, ValueError):
                    pass
            return super().__call__(obj)

    formatters["e2b/data"] = DataFrameData(parent=shell.display_formatter)
    formatters["e2b/chart"] = FigureChart(parent=shell.display_formatter)
    formatters["application/json"] = PlainJSON(parent=shell.display_formatter)
    formatters["text/plain"].max_seq_length = 0
    try:
        shell.run_line_magic("colors", "nocolor")
    except Exception:
        pass

    def patch_pil(image_mod):
        # Saving an image to a file shows it, and show() displays it in the
        # output instead of looking for an image viewer.
        from IPython.display import display

        image_cls = image_mod.Image
        if getattr(image_cls.save, "__cubicle__", False):
            return
        original_save = image_cls.save

        def save(self, fp, format=None, **params):
            if isinstance(fp, (str, bytes)) or hasattr(fp, "__fspath__"):
                display(self)
            return original_save(self, fp, format, **params)

        def show(self, title=None):
            display(self)

        save.__cubicle__ = True
        image_cls.save = save
        image_cls.show = show

    if "PIL.Image" in sys.modules:
        patch_pil(sys.modules["PIL.Image"])
        return

    import importlib.abc

    class PILHook(importlib.abc.MetaPathFinder):
        """Patches PIL.Image when user code first imports it."""

        def find_spec(self, name, path, target=None):
            if name != "PIL.Image":
                return None
            sys.meta_path.remove(self)
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find else None
                if spec is not None and spec.loader is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch_pil(module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, PILHook())


__cubicle_setup()
del __cubicle_setup
