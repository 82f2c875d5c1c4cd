// placeholder: filled by the GQA decode work (issue 25)
