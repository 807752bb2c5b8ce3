// 在 require.js 之后、html-manager（embed-amd.js）之前加载；由 _config.yml 的 nb_ipywidgets_js 引入，
// 只出现在含小部件状态的页面上。本文件为本书自写（MIT），不是第三方代码。
(function () {
  // 1. html-manager 按 AMD 模块地址推算自己的资源目录（图标字体等）。把它指到本地副本，
  //    否则浏览器会去页面所在目录下的 @jupyter-widgets/html-manager/dist/ 找字体而得到 404。
  var root = (document.documentElement.dataset && document.documentElement.dataset.content_root) || "";
  if (window.require && window.require.config) {
    window.require.config({
      paths: { "@jupyter-widgets/html-manager/dist": root + "_static/thirdparty/html-manager" },
    });
  }

  // 2. html-manager 按 MathJax 2 的接口（MathJax.Hub.Queue）给小部件标签排版公式，
  //    而本书用的是 MathJax 3。这里补一个很薄的兼容层，把请求转给 MathJax 3 的 typesetPromise。
  function ensureHub() {
    var mj = window.MathJax;
    if (!mj || mj.Hub) return;
    mj.Hub = {
      Queue: function () {
        Array.prototype.forEach.call(arguments, function (job) {
          if (!Array.isArray(job) || job[0] !== "Typeset") return;
          var el = job[2];
          var ready = (window.MathJax.startup && window.MathJax.startup.promise) || Promise.resolve();
          ready
            .then(function () {
              if (window.MathJax.typesetPromise) return window.MathJax.typesetPromise(el ? [el] : undefined);
            })
            .catch(function (err) { console.warn("MathJax typeset:", err); });
        });
      },
    };
  }
  ensureHub();
  document.addEventListener("DOMContentLoaded", ensureHub);
  window.addEventListener("load", ensureHub, { capture: true });
})();
