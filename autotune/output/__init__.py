"""What a user takes away: the export, the ``ls``/``show`` views and the HTML report."""
